"""The layer's constants: MPI's (MPICH's values where a program may print or compare them), the window
protocol's, and the layer's own settings."""

ALGORITHM_ENV = "NVLINK_EMU_MPI4PY_ALGORITHM"
ENVELOPE_BYTES = 8  # every point-to-point message carries its tag (int64) ahead of the data, on the links too

ANY_SOURCE, PROC_NULL, ROOT, ANY_TAG, UNDEFINED = -2, -1, -3, -1, -32766
TAG_UB = 2 ** 31 - 1
SUCCESS, ERR_BUFFER, ERR_COUNT, ERR_TYPE, ERR_TAG, ERR_COMM, ERR_RANK, ERR_REQUEST, ERR_ROOT = \
    0, 1, 2, 3, 4, 5, 6, 19, 7
ERR_OP, ERR_ARG, ERR_TRUNCATE, ERR_OTHER, ERR_INTERN, ERR_PENDING, ERR_UNSUPPORTED_OPERATION = 9, 12, 14, 15, 16, 18, 52
ERR_LASTCODE = 0x3fffffff
IDENT, CONGRUENT, SIMILAR, UNEQUAL = 0, 1, 2, 3
THREAD_SINGLE, THREAD_FUNNELED, THREAD_SERIALIZED, THREAD_MULTIPLE = 0, 1, 2, 3
KEYVAL_INVALID = 0x24000000
APPNUM = KEYVAL_INVALID
BSEND_OVERHEAD = 96
MAX_PROCESSOR_NAME = 128
VERSION, SUBVERSION = 4, 1
__version__ = "4.1.2"  # the mpi4py interface this layer follows

# -- one-sided communication (MPI.Win) ----------------------------------------------------------------
TAG = "rma"                # message keys of the window protocol: (TAG, window id, verb, number, ...)
INBOX_SLOT_MAX = 1 << 20   # bytes of one origin's slot in a target's inbox; a larger operand goes in pieces
INBOX_SLOT_MIN = 64        # a slot holds at least a compare-and-swap's two values of any type
INBOX_SLOT_DYNAMIC = 1 << 16  # a dynamic window's (its memory comes later)

LOCK_EXCLUSIVE, LOCK_SHARED = 234, 235
MODE_NOCHECK, MODE_NOSTORE, MODE_NOPUT, MODE_NOPRECEDE, MODE_NOSUCCEED = 1024, 2048, 4096, 8192, 16384
WIN_BASE, WIN_SIZE, WIN_DISP_UNIT, WIN_CREATE_FLAVOR, WIN_MODEL = 0x66000001, 0x66000003, 0x66000005, 0x66000007, \
    0x66000009
WIN_FLAVOR_CREATE, WIN_FLAVOR_ALLOCATE, WIN_FLAVOR_DYNAMIC, WIN_FLAVOR_SHARED = 1, 2, 3, 4
WIN_SEPARATE, WIN_UNIFIED = 1, 2
ERR_GROUP, ERR_WIN, ERR_DISP, ERR_LOCKTYPE, ERR_RMA_RANGE = 8, 45, 28, 46, 55  # MPICH's error classes
