"""The compact id table: a name's tag is found by its name or by its key, across splits."""

from tillerman.ledger.id_table import SPLIT_AT, IdTable, key_of


def test_a_key_looked_up_and_added_once_is_found_by_name_and_by_key_across_splits():
    table = IdTable()
    names = [f"f-{i:032x}" for i in range(SPLIT_AT * 40)]  # enough for several splits
    for i, name in enumerate(names):
        key = key_of(name)
        assert table.get_key(key) is None
        table.add_key(key, i)
    assert len(table) == len(names)
    assert all(table.get(name) == i for i, name in enumerate(names))
    assert all(table.get_key(key_of(name)) == i for i, name in enumerate(names))
    assert table.get("f-not-stored") is None


def test_put_replaces_a_tag_added_by_key_without_adding_a_record():
    table = IdTable()
    table.add_key(key_of("intent-1"), 3)
    table.put("intent-1", 7)
    assert table.get("intent-1") == 7
    assert len(table) == 1
