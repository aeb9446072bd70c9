"""The one thin transport: the only package that imports mpi4py.

`packets`: fabric packets between ranks (Transport; inline frames); `channels`: control traffic apart from them
(ControlChannel, MemberComms, Exchange, SwitchChannel, native_collective); `job`: the job and the waits of this
host's ranks (world rank and size, abort_job, Idle, Waker). The names below are the package's interface.
"""

from .channels import (INLINE_BYTES, MAX_P2P_CONTROL_BYTES, ROUND_MEMBERS, ControlChannel, Exchange, MemberComms,
                       SwitchChannel, any_rank, native_collective, split_roles)
from .job import (ABORT_GRACE_S, POKED_FIRST_NAP_S, POKED_MAX_NAP_S, Idle, Waker, abort_job, count_failed_ranks,
                  mpi_library_version, poked_idle, world_rank, world_size)
from .packets import (DELAY_ENV, INLINE_FRAME_BYTES, INLINE_MARK, INLINE_PAYLOAD_BYTES, MAILBOX_FABRIC, MAILBOX_P2P,
                      MAILBOX_PEER_BYTES, MAILBOX_PEER_MESSAGES, MAX_HEADER_BYTES, MAX_WANT_KEY_BYTES, TAG_CONTROL,
                      TAG_CREDIT, TAG_EXCHANGE, TAG_HEADER, TAG_PAYLOAD, WANTED, Transport, frame, mailbox_class,
                      unframe)

__all__ = ["ABORT_GRACE_S", "DELAY_ENV", "INLINE_BYTES", "INLINE_FRAME_BYTES", "INLINE_MARK", "INLINE_PAYLOAD_BYTES",
           "MAILBOX_FABRIC", "MAILBOX_P2P", "MAILBOX_PEER_BYTES", "MAILBOX_PEER_MESSAGES", "MAX_HEADER_BYTES",
           "MAX_P2P_CONTROL_BYTES", "MAX_WANT_KEY_BYTES", "POKED_FIRST_NAP_S", "POKED_MAX_NAP_S", "ROUND_MEMBERS",
           "TAG_CONTROL", "TAG_CREDIT", "TAG_EXCHANGE", "TAG_HEADER", "TAG_PAYLOAD", "WANTED", "ControlChannel",
           "Exchange", "Idle", "MemberComms", "SwitchChannel", "Transport", "Waker", "abort_job", "any_rank",
           "count_failed_ranks", "frame", "mailbox_class", "mpi_library_version", "native_collective", "poked_idle",
           "split_roles", "unframe", "world_rank", "world_size"]
