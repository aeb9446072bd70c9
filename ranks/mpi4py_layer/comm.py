"""MPI.Comm in the layer: queries and management; its point-to-point and collective calls are p2p's and coll's."""

from .coll import Collectives
from .constants import CONGRUENT, ERR_COMM, IDENT, TAG_UB, UNDEFINED, UNEQUAL
from .context import _ctx
from .errors import Exception  # noqa: A004 - MPI.Exception
from .groups import Group, comm_members
from .handles import _Handle
from .p2p import PointToPoint, _Engine
from .requests import Request, _Collective, _Done, _request


class Solo:
    """The emulator side of a one-member communicator (COMM_SELF, its Dups): every collective is a
    local copy, no link bytes; same i-forms as ranks.comm.Communicator."""

    size, rank = 1, 0

    def __init__(self, name: str):
        self.name = name

    def iallreduce(self, array, op="sum", algorithm="auto"):
        return _Done()

    def ireduce_scatter(self, send, recv, op="sum", algorithm="auto"):
        recv[:] = send[:recv.size]
        return _Done()

    def iallgather(self, send, recv, algorithm="auto"):
        recv[:] = send
        return _Done()

    def ibroadcast(self, array, root=0, algorithm="auto"):
        return _Done()

    def iall2allv(self, send, send_counts, recv, recv_counts):
        recv[:recv_counts[0]] = send[:send_counts[0]]
        return _Done()

    def ireduce(self, send, recv, root=0, op="sum", algorithm="auto"):
        recv[:] = send
        return _Done()

    def igather(self, send, recv, root=0):
        recv[:] = send
        return _Done()

    def iscatter(self, send, recv, root=0):
        recv[:] = send
        return _Done()

    def allgather_object(self, obj, op="allgather_object"):
        return [obj]

    def barrier(self):
        pass

    def split(self, color, key=None):
        return None if color is None else Solo(f"{self.name}.{color}")

    def release_group(self):
        pass

    def free(self):
        pass


class Comm(PointToPoint, Collectives, _Handle):
    """MPI.Comm over an emulator communicator (`_emu`: ranks.comm.Communicator, or Solo for one member)."""

    _mpi4py, _held = "Comm", "_emu"

    def __init__(self, comm=None):
        if isinstance(comm, Comm):
            self._emu, self._engine, self._name = comm._emu, comm._engine, comm._name
        else:
            self._emu, self._engine, self._name = None, None, ""

    @classmethod
    def _over(cls, emu, name: str) -> "Intracomm":
        comm = Intracomm()
        comm._emu, comm._name = emu, name
        comm._engine = _Engine(comm)
        _ctx.engines.append(comm._engine)
        return comm

    def __repr__(self):
        return f"<Intracomm {self._name or 'COMM_NULL'}>"

    def _live(self, call: str):
        if self._emu is None:
            raise Exception(ERR_COMM, f"MPI.Comm.{call} on COMM_NULL")
        return self._emu

    # -- queries ------------------------------------------------------------------------------------
    def Get_rank(self) -> int:
        return self._live("Get_rank").rank

    def Get_size(self) -> int:
        return self._live("Get_size").size

    rank = property(Get_rank)
    size = property(Get_size)

    def Get_name(self) -> str:
        return self._name

    def Set_name(self, name: str):
        self._name = name

    name = property(Get_name, Set_name)

    def Is_inter(self) -> bool:
        return False

    def Is_intra(self) -> bool:
        return True

    is_inter, is_intra = property(Is_inter), property(Is_intra)

    def Get_topology(self) -> int:
        return UNDEFINED

    topology = property(Get_topology)

    def Get_attr(self, keyval):
        if keyval == TAG_UB:
            return TAG_UB
        return None

    def Compare(self, other) -> int:
        if self._emu is other._emu:
            return IDENT
        mine, theirs = getattr(self._emu, "members", (None,)), getattr(other._emu, "members", (None,))
        return CONGRUENT if mine == theirs and type(self._emu) is type(other._emu) else UNEQUAL

    def Get_group(self):
        """The members as an MPI.Group (what windows and PSCW take)."""
        return Group(members=comm_members(self))

    # -- communicator management --------------------------------------------------------------------
    def Dup(self, info=None) -> "Intracomm":
        """A new communicator of the same members (collective)."""
        emu = self._live("Dup")
        return Comm._over(emu.split(0), f"{self._name}.dup")

    Clone = Dup

    def Split(self, color: int = 0, key: int = 0) -> "Intracomm":
        """Members of one color, ordered by (key, rank); color UNDEFINED gives COMM_NULL (collective)."""
        emu = self._live("Split")
        new = emu.split(None if color == UNDEFINED else color, key)
        if new is None:
            return Intracomm()
        if new.size == 1 and not isinstance(new, Solo):
            new.free()  # a one-member communicator is local copies: its MPI communicators are not needed
            new = Solo(new.name)
        return Comm._over(new, f"{self._name}.split")

    def Free(self) -> None:
        emu = self._live("Free")
        if self is COMM_WORLD or self is COMM_SELF:
            raise Exception(ERR_COMM, "MPI.Comm.Free of a predefined communicator")
        emu.free()
        if self._engine in _ctx.engines:
            _ctx.engines.remove(self._engine)
        self._emu = self._engine = None  # type: ignore[assignment]  # COMM_NULL (PointToPoint._engine)

    def Disconnect(self):
        self.Free()

    def Abort(self, errorcode: int = 0):
        from nvlink_emu.ranks.transport import abort_job
        abort_job(errorcode or 1)

    def Barrier(self) -> None:
        self._live("Barrier").barrier()

    barrier = Barrier

    def Ibarrier(self) -> Request:
        # out of band, as ranks.comm.Communicator.barrier: complete when every member reached it
        self.Barrier()
        return _request(_Collective([]))


class Intracomm(Comm):
    """MPI.Intracomm: every communicator of the layer (there are no intercommunicators)."""

    _mpi4py = "Intracomm"


Comm._family = Comm
COMM_NULL = Intracomm()
COMM_WORLD = Intracomm()
COMM_SELF = Intracomm()
