"""mpi4py's MPI module over the emulated fabric: COMM_WORLD is the GPUs, every byte goes through the switch.

A program's `from mpi4py import MPI` gets this module while it runs under `nvlink-emu run --mpi4py`
(ranks/mpi4py_layer/__init__.py installs it). Buffers are copied into GPU memory (gpu.alloc) and
moved by the emulator's collectives and messages; those host copies are not link traffic. See the
docs/guide/mpi4py.md, for what is supported and how each call maps onto the fabric.

The names live in the modules of this package, by concern (constants, errors, context, datatypes, buffers,
ops, requests, p2p, coll, groups, info, comm, win with rma_epochs and rma_ops, runtime); this module is
the facade a program sees: every MPI.X is one of theirs, the same object.
"""

# every import is a re-export: the names a program reaches as MPI.X
# ruff: noqa: F401
from .constants import (ALGORITHM_ENV, ANY_SOURCE, ANY_TAG, APPNUM, BSEND_OVERHEAD, CONGRUENT, ENVELOPE_BYTES,
                        ERR_ARG, ERR_BUFFER, ERR_COMM, ERR_COUNT, ERR_DISP, ERR_GROUP, ERR_INTERN, ERR_LASTCODE,
                        ERR_LOCKTYPE, ERR_OP, ERR_OTHER, ERR_PENDING, ERR_RANK, ERR_REQUEST, ERR_RMA_RANGE,
                        ERR_ROOT, ERR_TAG, ERR_TRUNCATE, ERR_TYPE, ERR_UNSUPPORTED_OPERATION, ERR_WIN, IDENT,
                        KEYVAL_INVALID, LOCK_EXCLUSIVE, LOCK_SHARED, MAX_PROCESSOR_NAME, MODE_NOCHECK,
                        MODE_NOPRECEDE, MODE_NOPUT, MODE_NOSTORE, MODE_NOSUCCEED, PROC_NULL, ROOT, SIMILAR,
                        SUBVERSION, SUCCESS, TAG_UB, THREAD_FUNNELED, THREAD_MULTIPLE, THREAD_SERIALIZED,
                        THREAD_SINGLE, UNDEFINED, UNEQUAL, VERSION, WIN_BASE, WIN_CREATE_FLAVOR, WIN_DISP_UNIT,
                        WIN_FLAVOR_ALLOCATE, WIN_FLAVOR_CREATE, WIN_FLAVOR_DYNAMIC, WIN_FLAVOR_SHARED, WIN_MODEL,
                        WIN_SEPARATE, WIN_SIZE, WIN_UNIFIED, __version__)
from .errors import Exception, MalformedMessage, MissingCall
from .context import check_algorithm
from .datatypes import (AINT, BOOL, BYTE, CHAR, COMPLEX, COUNT, CXX_BOOL, C_BOOL, C_COMPLEX, C_DOUBLE_COMPLEX,
                        C_FLOAT_COMPLEX, C_LONG_DOUBLE_COMPLEX, DATATYPE_NULL, DOUBLE, DOUBLE_INT, DOUBLE_PRECISION,
                        Datatype, FLOAT, FLOAT_INT, INT, INT16_T, INT32_T, INT64_T, INT8_T, INTEGER, INT_INT,
                        LOGICAL, LONG, LONG_DOUBLE, LONG_DOUBLE_INT, LONG_INT, LONG_LONG, OFFSET, PACKED, REAL,
                        SHORT, SHORT_INT, SIGNED_CHAR, SIGNED_INT, SIGNED_LONG, SIGNED_SHORT, TWOINT, UINT16_T,
                        UINT32_T, UINT64_T, UINT8_T, UNSIGNED, UNSIGNED_CHAR, UNSIGNED_INT, UNSIGNED_LONG,
                        UNSIGNED_LONG_LONG, UNSIGNED_SHORT, WCHAR, dtype_datatype, predefined, typecode_datatype)
from .buffers import BOTTOM, Get_address, IN_PLACE, Message, is_in_place, message_simple, message_vector
from .ops import (BAND, BOR, BXOR, LAND, LOR, LXOR, MAX, MAXLOC, MIN, MINLOC, NO_OP, OP_NULL, Op, PROD, REPLACE,
                  SUM, native_reduction, reduce_rows)
from .requests import Grequest, Prequest, REQUEST_NULL, Request, Status
from .p2p import KEPT_BYTES, KEPT_MESSAGES
from .groups import GROUP_EMPTY, Group
from .info import (ERRHANDLER_NULL, ERRORS_ABORT, ERRORS_ARE_FATAL, ERRORS_RETURN, Errhandler, INFO_ENV, INFO_NULL,
                   Info)
from .comm import COMM_NULL, COMM_SELF, COMM_WORLD, Comm, Intracomm
from .win import WIN_NULL, Win
from .handles import _missing
from .runtime import (Alloc_mem, Attach_buffer, Compute_dims, Detach_buffer, Finalize, Free_mem,
                      Get_library_version, Get_processor_name, Get_version, Init, Init_thread, Is_finalized,
                      Is_initialized, Is_thread_main, Pcontrol, Query_thread, Wtick, Wtime, bind, emulated_gpu,
                      get_vendor, link_counters, modeled_time_ns, pickle, unbind)

__all__ = ["BOTTOM", "IN_PLACE", "DATATYPE_NULL", "Datatype"]  # re-exported: mpi4py's MPI names them

globals()["2INT"] = TWOINT
# MPI types that C has and numpy does not model here: DATATYPE_NULL, as an MPI without them reports
for _name in ("LB", "UB", "LOGICAL1", "LOGICAL2", "LOGICAL4", "LOGICAL8", "LOGICAL16", "INTEGER16", "REAL2",
              "COMPLEX4", "BFLOAT16_T", "CHARACTER", "CXX_FLOAT_COMPLEX", "CXX_DOUBLE_COMPLEX",
              "CXX_LONG_DOUBLE_COMPLEX", "SIGNED_LONG_LONG", "UNSIGNED_LONG_LONG_INT", "DOUBLE_COMPLEX",
              "INTEGER1", "INTEGER2", "INTEGER4", "INTEGER8", "REAL4", "REAL8", "REAL16", "COMPLEX8", "COMPLEX16",
              "COMPLEX32", "2REAL", "2DOUBLE_PRECISION", "2INTEGER", "C_WCHAR"):
    globals().setdefault(_name, DATATYPE_NULL)


def __getattr__(name: str):
    raise _missing("", name)
