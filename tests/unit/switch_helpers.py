"""Helpers shared by the switch-logic unit tests."""

from fabric.packets import Kind


def only_nack(sends, port, req):
    """The one NACK in `sends`, to `port`, answering request `req`, with no payload."""
    assert len(sends) == 1
    send = sends[0]
    assert send.port == port and send.packet.kind is Kind.NACK and send.packet.req == req
    assert send.payload is None
    return send.packet
