"""What a switch decides to send: one packet, out of one port or to another switch."""

from dataclasses import dataclass

import numpy as np

from ..packets import Packet


@dataclass(frozen=True)
class Send:
    """Send `packet` towards GPU `port` (a GPU index: out of its port if it is attached here, else up
    the link to the next switch) with `payload` (uint8 bytes) if it carries one."""

    port: int
    packet: Packet
    payload: np.ndarray | None = None
    origin: int | None = None  # who the data comes from: the ingress GPU (None) or the switch itself (-1)
    switch: int | None = None  # to that switch itself (in-switch traffic between switches; counted already)
    via: int | None = None     # the spine switch it goes up to, if the leaf rerouted it (fabric.faults)
