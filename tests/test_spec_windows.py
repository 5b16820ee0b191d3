"""[windows] (toolchain/spec/windows.py): one graph per input length, declared once; and
the bundle's route."""
from __future__ import annotations

import pytest

from toolchain import spec
from toolchain.errors import SpecError
from toolchain.spec import chips
from toolchain.spec.windows import by_size, routed


@pytest.fixture
def windowed(project):
    return project.add_windowed()


def test_each_smaller_window_is_a_graph_of_its_own_cut_on_the_declared_axes(windowed):
    model = spec.load(windowed, chips.load())
    assert [g.name for g in model.graphs] == ["net", "net_16f", "net_32f"]
    assert model.graph("net_16f").inputs[0].shape == (1, 16, 256)
    assert model.graph("net_32f").outputs[0].shape == (1, 32, 256)
    # the largest is the graph as declared
    assert model.graph("net").inputs[0].shape == (1, 64, 256)
    assert by_size(model.windows) == {
        16: {"net": "net_16f"},
        32: {"net": "net_32f"},
        64: {"net": "net"},
    }
    assert model.windows["route"] == (16, 64)


@pytest.mark.parametrize(
    "old,new,expected",
    [
        (
            "sizes = [16, 32, 64]",
            "sizes = [64]",
            "windows.sizes: expected two or more positive integers",
        ),
        (
            "sizes = [16, 32, 64]",
            "sizes = [32, 16, 64]",
            "windows.sizes: expected each size once, smallest first",
        ),
        (
            "sizes = [16, 32, 64]",
            "sizes = [16, 32, 48]",
            "windows.axes.x: x's length 64 at 48f is not a whole number at 16f",
        ),
        (
            'graphs = ["net"]',
            'graphs = ["nett"]',
            "windows.graphs: 'nett' is not a graph of this model",
        ),
        (
            "axes = { x = 1, y = 1 }",
            "axes = { x = 3, y = 1 }",
            "windows.axes.x: expected an axis of shape [1, 64, 256]",
        ),
        (
            "axes = { x = 1, y = 1 }",
            "axes = { z = 1 }",
            "windows.axes.z: no tensor 'z' in the graphs ['net']",
        ),
        (
            "route = [16, 64]",
            "route = [16, 32]",
            'windows.route: expected "auto" or a list of the sizes',
        ),
        ('unit = "f"', 'unit = "F"', "windows.unit: 'F' becomes part of graph names"),
        (
            "route = [16, 64]",
            "route = [16, 64]\nsize = 3",
            "windows.size: unknown key; did you mean 'sizes'?",
        ),
    ],
)
def test_a_bad_windows_table_names_file_and_field(project, windowed, old, new, expected):
    project.edit("models/windowed.toml", old, new)
    with pytest.raises(SpecError) as err:
        spec.load(windowed, chips.load())
    assert str(err.value).startswith(f"{windowed}: ")
    assert expected in str(err.value)


def test_auto_routes_the_largest_and_each_window_the_model_code_found_safe():
    windows = {"sizes": (5, 10, 30), "unit": "s", "graphs": ("encoder", "decoder"), "route": "auto"}
    task = {
        "windows": {
            "5": {"safe": False, "summary": "9/9 same text; 2/9 as at 30 s"},
            "10": {"safe": True},
        }
    }
    assert routed(windows, task) == (
        [10, 30],
        {5: "its outputs differ from the 30s window's: 9/9 same text; 2/9 as at 30 s"},
    )
    assert routed(windows, None)[0] == [30]   # nothing measured: only the largest
    assert routed({**windows, "route": (5, 30)}, task) == ([5, 30], {10: "not in the spec's route"})
