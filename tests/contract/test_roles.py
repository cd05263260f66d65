"""Role placements: several workers of a role on one node fold into one placement; the device map and GPUs by
role follow from them; the wire form round-trips."""

from trimtab.contract.roles import RolePlacement, device_map_of, gpus_by_role, merge


def test_workers_of_a_role_on_a_node_fold_into_one_placement_and_give_the_device_map():
    found = merge([RolePlacement("actor", "b", (1,), (11,)), RolePlacement("actor", "a", (1,), (2,)),
                   RolePlacement("actor", "a", (0,), (1,)), RolePlacement("critic", "a", (), (5,))])
    assert found == [RolePlacement("actor", "a", (0, 1), (1, 2)), RolePlacement("actor", "b", (1,), (11,)),
                     RolePlacement("critic", "a", (), (5,))]
    assert device_map_of(found) == {"actor": [0, 1]}  # a role whose GPUs are unknown has no entry
    assert gpus_by_role(found, {}, ["a", "b"]) == {"actor": {"a": [0, 1], "b": [1]}}
    assert [RolePlacement.from_wire(p.to_wire()) for p in found] == found


def test_a_typed_device_map_gives_gpus_by_role_only_where_the_node_is_known():
    assert gpus_by_role([], {"actor": [0], "critic": []}, ["a"]) == {"actor": {"a": [0]}}
    assert gpus_by_role([], {"actor": [0]}, ["a", "b"]) == {}  # local indices on which node? not said
