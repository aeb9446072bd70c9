"""The agents: GPU ranks and the switch rank; the only code that talks MPI (through nvlink_emu.ranks.transport)."""
