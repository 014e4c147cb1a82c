"""The fusion table (DNNFusion Table 3 as reconstructed in docs/algorithms.md): all 25 cells, their
colours and fused types against an independent transcription, the conservative switch, and the
rules' human-readable reasons."""
import itertools

import pytest

import kernelgen as kg
from kernelgen.mapping_types import (Colour, FusionRule, MappingType, folds_to_flat, fusion_rule,
                                     fusion_table)

# Transcribed from the project's research notes on DNNFusion (PLDI 2021), "Table 3 - fusion of
# (first -> second)", with the contested cells starred; docs/algorithms.md has the same table.
# Rows = first (producer), columns = second (consumer); "—" (no fused type) is None.
_ROWS = ["One-to-One", "One-to-Many", "Many-to-Many", "Reorganize", "Shuffle"]
_ABBREV = {"OtO": "One-to-One", "OtM": "One-to-Many", "MtM": "Many-to-Many",
           "Reorg": "Reorganize", "Shuffle": "Shuffle", "—": None}
_TABLE_3 = """
| **One-to-One**   | OtO / G | OtM / G* | MtM / G* | Reorg / G | Shuffle / G |
| **One-to-Many**  | OtM / G | OtM / Y  | — / **R** | OtM / Y  | OtM / Y |
| **Many-to-Many** | MtM / G | MtM / Y  | — / **R** | MtM / Y  | MtM / Y |
| **Reorganize**   | Reorg / G | OtM / Y | MtM / Y | Reorg / G | Reorg / G |
| **Shuffle**      | Shuffle / G | OtM / Y | MtM / Y | Reorg / G | Shuffle / G |
"""
_COLOURS = {"G": "green", "Y": "yellow", "R": "red"}


def _expected():
    """(first, second) -> (fused type or None, colour name), parsed from the table above."""
    out = {}
    lines = _TABLE_3.strip().splitlines()
    assert len(lines) == 5
    for line in lines:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        first = MappingType(cells[0].strip("*").strip())
        assert len(cells) == 6
        for second_name, cell in zip(_ROWS, cells[1:]):
            fused, colour = (part.strip().strip("*") for part in cell.split("/"))
            name = _ABBREV[fused]
            out[(first, MappingType(second_name))] = (
                None if name is None else MappingType(name), _COLOURS[colour])
    return out


EXPECTED = _expected()

OTO, OTM, MTM = MappingType.ONE_TO_ONE, MappingType.ONE_TO_MANY, MappingType.MANY_TO_MANY


def test_transcription_is_complete():
    assert len(EXPECTED) == 25
    assert set(EXPECTED) == set(itertools.product(MappingType, MappingType))
    # spot checks of the transcription itself
    assert EXPECTED[(OTM, MTM)] == (None, "red")
    assert EXPECTED[(MappingType.SHUFFLE, MappingType.REORGANIZE)] == (
        MappingType.REORGANIZE, "green")


def test_table_has_exactly_25_cells():
    table = fusion_table()
    assert len(table) == 25
    assert set(table) == set(itertools.product(MappingType, MappingType))
    for (first, second), rule in table.items():
        assert isinstance(rule, FusionRule)
        assert (rule.first, rule.second) == (first, second)


@pytest.mark.parametrize("cell", sorted(EXPECTED, key=lambda c: (c[0].value, c[1].value)),
                         ids=lambda c: f"{c[0].value}->{c[1].value}")
def test_cell_matches_algorithms_md(cell):
    fused, colour = EXPECTED[cell]
    rule = fusion_table()[cell]
    assert rule.colour is Colour(colour)
    assert rule.colour.value == colour
    assert rule.fused is fused
    assert fusion_rule(*cell) == rule


def test_red_cells_are_exactly_the_two_reductions_after_expansion_or_reduction():
    reds = {cell for cell, rule in fusion_table().items() if rule.colour is Colour.RED}
    assert reds == {(OTM, MTM), (MTM, MTM)}
    for cell in reds:
        assert fusion_table()[cell].fused is None
    assert all(rule.fused is not None for rule in fusion_table().values()
               if rule.colour is not Colour.RED)


def test_one_to_one_is_the_identity_of_fusion():
    table = fusion_table()
    for other in MappingType:
        assert table[(OTO, other)].fused is other
        assert table[(other, OTO)].fused is other
        assert table[(OTO, other)].colour is Colour.GREEN
        assert table[(other, OTO)].colour is Colour.GREEN


def test_conservative_switch_changes_exactly_two_cells():
    default = fusion_table()
    conservative = fusion_table(conservative_oto_into_heavy=True)
    assert set(conservative) == set(default)
    changed = {cell for cell in default if default[cell] != conservative[cell]}
    assert changed == {(OTO, OTM), (OTO, MTM)}
    for cell in changed:
        assert default[cell].colour is Colour.GREEN
        assert conservative[cell].colour is Colour.YELLOW
        assert conservative[cell].fused is default[cell].fused  # only the colour moves
        assert conservative[cell].reason
    for cell in set(default) - changed:
        assert conservative[cell].colour is default[cell].colour
        assert conservative[cell].fused is default[cell].fused
    assert fusion_rule(OTO, MTM, conservative_oto_into_heavy=True) == conservative[(OTO, MTM)]


def test_every_rule_has_a_reason_and_its_string_mentions_the_colour():
    for flag in (False, True):
        for (first, second), rule in fusion_table(conservative_oto_into_heavy=flag).items():
            assert isinstance(rule.reason, str) and rule.reason.strip()
            text = str(rule)
            assert rule.colour.value in text
            assert first.value in text and second.value in text
            assert rule.reason in text


def test_colour_strings():
    assert {str(c) for c in Colour} == {"green", "yellow", "red"}


def test_a_free_reshape_fuses_as_one_to_one():
    """A Reorganize edge whose reshape folds back to the flat offset (``folds_to_flat``) is
    green beside a reduction or an expansion, where the table's cell says measure: it moves no
    element. A transpose (Shuffle), or a reshape of a transpose (also between two free
    reshapes, as ShuffleNet's channel shuffle), keeps the table's yellow."""
    x = kg.tensor("x", (2, 6, 5, 7))
    pooled = kg.global_pool("GlobalAveragePool", x)
    flat = kg.flatten(pooled)
    assert flat.input_mapping_types == (MappingType.REORGANIZE,)
    assert folds_to_flat(flat.index_maps[0])
    merged = kg.reshape(kg.tensor("y", (3, 5, 7)), (3, 35))
    assert folds_to_flat(merged.index_maps[0])  # 35*o0 + 7*(o1 // 7) + o1 % 7 folds to 35*o0 + o1
    three = kg.reshape(kg.tensor("v", (3, 4, 5, 7)), (3, 140))
    assert folds_to_flat(three.index_maps[0])  # 35*(o1 // 35) + 7*(o1 // 7 % 5) + o1 % 7
    shuffled = kg.transpose(kg.tensor("z", (3, 140)))
    assert not folds_to_flat(shuffled.index_maps[0])

    def rules(*ops):
        return {(e.producer, e.consumer): e.rule for e in kg.fuse(*ops, force=True).edges}

    into_pool = rules(pooled, flat)[(pooled.name, flat.name)]
    assert (into_pool.colour, into_pool.fused) == (Colour.GREEN, MTM)
    assert "reshape" in into_pool.reason
    gemm = kg.gemm(flat, kg.tensor("w", (6, 3)))
    out_of = rules(flat, gemm)[(flat.name, gemm.name)]
    assert (out_of.colour, out_of.fused) == (Colour.GREEN, MTM)
    t = kg.transpose(kg.tensor("a", (9, 6)))
    reshaped = kg.reshape(t, (6, 9))
    mm = kg.matmul(reshaped, kg.tensor("b", (9, 4)))
    chain = rules(t, reshaped, mm)
    assert chain[(reshaped.name, mm.name)].colour is Colour.YELLOW
    # ShuffleNet's channel shuffle: free reshapes on both sides of the transpose do not make
    # the shuffled channels a free reshape of the conv's input
    x = kg.tensor("s", (1, 12, 5, 5))
    split = kg.reshape(x, (1, 2, 6, 5, 5))
    swapped = kg.transpose(split, (0, 2, 1, 3, 4))
    merged = kg.reshape(swapped, (1, 12, 5, 5))
    conv = kg.conv(merged, kg.tensor("k", (4, 12, 1, 1)))
    assert folds_to_flat(split.index_maps[0]) and folds_to_flat(merged.index_maps[0])
    shuffle = rules(split, swapped, merged, conv)
    assert shuffle[(merged.name, conv.name)].colour is Colour.YELLOW
    # beside a One-to-One op the table's cells are green already and keep their reasons
    relu = kg.relu(flat)
    assert rules(flat, relu)[(flat.name, relu.name)] == fusion_rule(
        MappingType.REORGANIZE, OTO)
