"""The methods' names: the one each has in the benchmarks' flags, files and tables, the other spellings
every ``--methods`` accepts for it, the names in tables and figures, and the order of their rows."""

from fly_modules.adapters import spelling_key

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
#: The paper's and the official code's labels that the library's spelling rule does not fold into a name
#: (:func:`fly_modules.adapters.spelling_key`: case, ``-`` and ``_`` do not matter, so ``codaprompt``,
#: ``SD_LoRA`` and ``seqft`` need no entry).
METHOD_ALIASES = {"coda-p": "coda-prompt", "s-prompt++": "s-prompt", "hide-prompt": "hide"}

_BY_KEY = {spelling_key(spelt): name for spelt, name in [*((n, n) for n in METHOD_ORDER), *METHOD_ALIASES.items()]}


def canonical_method(name: str) -> str:
    """The benchmarks' name of the method spelt ``name`` (``coda_prompt``, ``CODA-P`` -> ``coda-prompt``), by
    the library's spelling rule; a name of no method comes back as spelt, lower-cased, for the registry to
    refuse with its list."""
    spelt = name.strip()
    return _BY_KEY.get(spelling_key(spelt), spelt.lower())
