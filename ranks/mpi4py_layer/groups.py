"""MPI.Group in the layer: an ordered set of GPUs (what Win.Get_group, Comm.Get_group and PSCW take)."""

from .constants import IDENT, SIMILAR, UNDEFINED, UNEQUAL
from .context import _gpu
from .handles import _Mpi4pyNames


class Group(_Mpi4pyNames):
    """MPI.Group: an ordered set of GPUs (world indices); `rank` is this GPU's place in it."""

    _mpi4py = "Group"

    def __init__(self, group=None, members=()):
        self._members = tuple(group._members) if isinstance(group, Group) else tuple(members)
        self._freed = False

    def _me(self) -> int:
        return _gpu().rank

    def Get_size(self) -> int:
        return len(self._members)

    def Get_rank(self) -> int:
        me = self._me()
        return self._members.index(me) if me in self._members else UNDEFINED

    size, rank = property(Get_size), property(Get_rank)

    def Incl(self, ranks) -> "Group":
        return Group(members=[self._members[r] for r in ranks])

    def Excl(self, ranks) -> "Group":
        out = set(ranks)
        return Group(members=[m for r, m in enumerate(self._members) if r not in out])

    def Translate_ranks(self, ranks=None, group=None):
        ranks = range(len(self._members)) if ranks is None else ranks
        if group is None:
            return [self._members[r] for r in ranks]
        return [group._members.index(self._members[r]) if self._members[r] in group._members else UNDEFINED
                for r in ranks]

    @staticmethod
    def Compare(group1, group2) -> int:
        if group1._members == group2._members:
            return IDENT
        return SIMILAR if sorted(group1._members) == sorted(group2._members) else UNEQUAL

    def Dup(self) -> "Group":
        return Group(self)

    def Free(self) -> None:
        self._freed = True

    def __eq__(self, other):
        return isinstance(other, Group) and other._members == self._members

    __hash__ = None  # type: ignore[assignment]  # unhashable: __eq__ compares members


GROUP_EMPTY = Group()


def comm_members(comm) -> tuple:
    """World GPU indices of an MPI.Comm's members, in rank order."""
    emu = comm._live("Get_group")
    return tuple(getattr(emu, "members", (_gpu().rank,)))
