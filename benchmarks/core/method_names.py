"""The methods' names: the one each has in the benchmarks' flags, files and tables, the other spellings
every ``--methods`` accepts for it, the names in tables and figures, and the order of their rows."""

__all__ = ["METHOD_ALIASES", "METHOD_NAMES", "METHOD_ORDER", "canonical_method"]

#: Rows follow the paper's method order (its main table, then its cross-ablation), FlyPrompt last.
METHOD_ORDER = {name: i for i, name in enumerate(
    ("seq-ft", "seq-ft-sl", "l2p", "dualprompt", "coda-prompt", "mvp", "misa", "s-prompt", "hide", "norga", "hide-lora",
     "hide-adapter", "sd-lora", "ranpac", "ranpac-frozen", "ranpac-collect", "linear-probe", "flyprompt"))}
METHOD_NAMES = {"seq-ft": "Seq FT", "seq-ft-sl": "Seq FT w/ SL", "l2p": "L2P", "dualprompt": "DualPrompt",
                "coda-prompt": "CODA-P", "mvp": "MVP", "misa": "MISA", "s-prompt": "S-Prompt++", "hide": "HiDe-Prompt",
                "norga": "NoRGa", "hide-lora": "HiDe-LoRA", "hide-adapter": "HiDe-Adapter", "sd-lora": "SD-LoRA",
                "ranpac": "RanPAC†", "ranpac-frozen": "RanPAC‡", "ranpac-collect": "RanPAC*", "linear-probe": "Linear probe",
                "flyprompt": "FlyPrompt"}
#: Spellings of a method beside its name (after :func:`canonical_method` lower-cases it and reads ``_`` as
#: ``-``): the library's registry writes some names in one word (``retrofit(method="codaprompt")``), the
#: official code others (``--method sdlora``).
METHOD_ALIASES = {"codaprompt": "coda-prompt", "coda-p": "coda-prompt", "sprompt": "s-prompt", "sdlora": "sd-lora",
                  "seqft": "seq-ft", "hide-prompt": "hide", "hidelora": "hide-lora", "hideadapter": "hide-adapter",
                  "sprompt++": "s-prompt", "s-prompt++": "s-prompt"}


def canonical_method(name: str) -> str:
    """The benchmarks' name of the method spelt ``name`` (``coda_prompt``, ``CODA-P`` -> ``coda-prompt``); a
    name of no method comes back as spelt, lower-cased, for the registry to refuse with its list."""
    spelt = name.strip().lower().replace("_", "-")
    return METHOD_ALIASES.get(spelt, spelt)
