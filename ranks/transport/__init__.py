"""The one thin transport: the only package that imports mpi4py.

`packets`: fabric packets between ranks (Transport; inline frames); `channels`: control traffic apart from them
(ControlChannel, MemberComms, Exchange, SwitchChannel, native_collective); `job`: the job and the waits of this
host's ranks (world rank and size, abort_job, Idle, Waker). The names below are the package's interface; its limits and tags are read from the module that defines them
(transport.packets.MAX_HEADER_BYTES, ...), the one place they live.
"""

from .channels import ControlChannel, Exchange, MemberComms, SwitchChannel, any_rank, native_collective, split_roles
from .job import Idle, Waker, abort_job, count_failed_ranks, mpi_library_version, poked_idle, world_rank, world_size
from .packets import Transport, frame, mailbox_class, unframe

__all__ = ["ControlChannel", "Exchange", "Idle", "MemberComms", "SwitchChannel", "Transport", "Waker", "abort_job", "any_rank",
           "count_failed_ranks", "frame", "mailbox_class", "mpi_library_version", "native_collective", "poked_idle", "split_roles", "unframe", "world_rank", "world_size"]
