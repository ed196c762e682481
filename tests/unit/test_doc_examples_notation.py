"""The notation the pages' console examples are checked with (tests/doc_examples.py)."""

from __future__ import annotations

import pytest

from tests.doc_examples import console_examples, output_matches

DOC = """intro
```console
$ echo one     # a comment
one

$ x=2
$ echo "$x"
2
```
```sh
$ not a console block
```
```console
$ seq 3
1
...
```
"""


def test_blocks_commands_and_expected_output() -> None:
    blocks = console_examples(DOC)
    assert [[e.command for e in b] for b in blocks] == [["echo one     # a comment", "x=2", 'echo "$x"'], ["seq 3"]]
    assert blocks[0][0].expected == ("one",)
    assert blocks[0][1].expected == ()
    assert blocks[0][0].line == 3
    assert blocks[1][0].expected == ("1", "...")


def test_text_before_the_first_command_is_refused() -> None:
    with pytest.raises(ValueError, match="before its first"):
        console_examples("```console\nstray\n$ true\n```\n")


@pytest.mark.parametrize(
    ("expected", "actual", "fits"),
    [
        (["a", "b"], ["a", "b"], True),
        (["a", "b"], ["a", "b", ""], True),
        (["a", "b"], ["a"], False),
        (["a"], ["a", "b"], False),
        (["a", "...", "z"], ["a", "z"], True),
        (["a", "...", "z"], ["a", "b", "c", "z"], True),
        (["a", "...", "z"], ["a", "b", "c"], False),
        (["...", "end"], ["x", "end"], True),
        (['{"ms": ..., "ok": true}'], ['{"ms": 2.9, "ok": true}'], True),
        (['{"ms": ..., "ok": true}'], ['{"ms": 2.9, "ok": false}'], False),
        (["Wall time: 0 seconds"], ["Wall time: 0.0 seconds"], False),
        (["x (y)"], ["x (y)"], True),
        (["..."], [], True),
    ],
)
def test_output_matching(expected: list[str], actual: list[str], fits: bool) -> None:
    assert output_matches(expected, actual) is fits
