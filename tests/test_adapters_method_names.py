"""One spelling rule for method names: the library's registry accepts the benchmarks' spellings
(``"coda-prompt"``), and :func:`method_names` is the table both read."""

from __future__ import annotations

import pytest

pytest.importorskip("timm")
from fly_modules.adapters import canonical_method, list_families, method_names, retrofit, spelling_key  # noqa: E402
from flygcl_standins import FlyGCLCodaPrompt  # noqa: E402
from upstream_cases import ROUTER  # noqa: E402

from fly_modules import InvalidParameterError  # noqa: E402


@pytest.mark.parametrize("spelt, canonical", [
    ("coda-prompt", "coda_prompt"), ("CODA_Prompt", "coda_prompt"), ("codaprompt", "coda_prompt"),
    ("s-prompt", "sprompt"), ("sd-lora", "sdlora"), ("MISA", "misa"), ("dualprompt", "dualprompt"),
])
def test_every_spelling_names_its_canonical_method(spelt, canonical):
    assert canonical_method(spelt) == canonical


def test_the_table_holds_every_registered_name_once():
    table = method_names()
    listed = [name for canonical, aliases in table.items() for name in (canonical, *aliases)]
    assert sorted(listed) == list_families()
    assert all(spelling_key(alias) == spelling_key(c) for c, aliases in table.items() for alias in aliases)
    assert len({spelling_key(c) for c in table}) == len(table)


def test_retrofit_accepts_the_benchmarks_spelling_and_refuses_an_unknown_one():
    model = FlyGCLCodaPrompt()
    model.process_task_count()
    handle = retrofit(model, "coda-prompt", **ROUTER)
    assert handle.family == "coda_prompt"
    handle.remove()
    with pytest.raises(InvalidParameterError, match="method must be one of .*got 'coda-promt'"):
        retrofit(model, "coda-promt", **ROUTER)
