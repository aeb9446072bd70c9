"""Communicators of GPUs: the out-of-band control exchange (barrier, allgather_object) and, on top
of it, the collectives (see ranks/collectives)."""

import itertools


class Communicator:
    """A group of GPUs. rank: this GPU's index in the group; size: members; members: GPU indices.

    Control operations travel out of band (like the sockets real programs use to swap handles):
    they are not NVLink traffic and are not counted on links.
    """

    def __init__(self, gpu, members: tuple[int, ...], comm_id: tuple):
        self.gpu = gpu
        self.members = tuple(members)
        self.size = len(self.members)
        self.rank = self.members.index(gpu.rank)
        self.comm_id = comm_id
        self._seq = itertools.count()

    def allgather_object(self, obj, op: str = "allgather_object") -> list:
        """Every member's `obj`, in member order (pickled, out of band, not counted)."""
        seq = next(self._seq)
        gpu = self.gpu
        for peer in self.members:
            if peer != gpu.rank:
                gpu._control.send(peer, (self.comm_id, seq, obj))
        box = gpu._control_box

        def missing():
            return [p for p in self.members if p != gpu.rank and (self.comm_id, seq, p) not in box]

        gpu._wait(lambda: not missing(), f"{op} #{seq} on communicator {self.comm_id}",
                  _LazyText(lambda: f"GPUs {missing()}"))
        return [obj if p == gpu.rank else box.pop((self.comm_id, seq, p)) for p in self.members]

    def barrier(self) -> None:
        """Wait until every member reached the barrier; this GPU's puts are fenced first."""
        self.gpu.fence()
        self.allgather_object(None, "barrier")


class _LazyText:
    """A string computed only when printed (the missing set is known only at the deadline)."""

    def __init__(self, make):
        self._make = make

    def __str__(self):
        return self._make()

    __format__ = lambda self, spec: format(str(self), spec)
