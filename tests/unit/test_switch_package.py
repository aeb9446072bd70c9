"""fabric.switch as a package of rooms (issue 27): every name other modules took from the one-file
fabric/switch.py still comes from `nvlink_emu.fabric.switch`, and each room a leaf hands packets to is
its own object, reached through the leaf."""

from nvlink_emu.fabric import preset


def test_the_names_other_modules_import_still_come_from_the_package():
    from nvlink_emu.fabric import switch
    from nvlink_emu.fabric.packets import Kind

    assert switch.SwitchLogic.__module__ == "nvlink_emu.fabric.switch.leaf"
    assert switch.SpineLogic.__module__ == "nvlink_emu.fabric.switch.spine"
    assert switch.Send.__module__ == "nvlink_emu.fabric.switch.send"
    assert switch.MAX_LOADS == 1024 and switch.MAX_AWAITED == 1 << 16 and switch.GONE_KEPT == 4096
    assert switch.REPLY_OF == {Kind.PUT: Kind.PUT_ACK, Kind.GET: Kind.GET_DATA}
    assert switch.SERVED_REPLIES == {Kind.PUT_ACK, Kind.GET_DATA} and Kind.LOAD not in switch.FROM_GPU


def test_a_leaf_hands_packets_to_rooms_that_each_keep_their_own_state():
    from nvlink_emu.fabric.switch import SwitchLogic

    leaf = SwitchLogic(preset("dgx-h100", gpus=4))
    rooms = (leaf.p2p, leaf.in_switch, leaf.spanning, leaf.stores, leaf.nvls, leaf.control)
    assert len({id(room) for room in rooms}) == 6 and all(room.leaf is leaf for room in rooms)
    assert leaf.awaited_replies == 0 and leaf.max_loads == leaf.nvls.max_loads
    assert leaf.store_targets(1) == () and leaf.remote_members(1) == ()
