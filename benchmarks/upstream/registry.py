"""The repositories, their checkout folders and documented commits, and the rows of the table in
``docs/adapters.md`` with the harnesses behind each row."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Tuple

from benchmarks.core.checkout_commit import checkout_commit

__all__ = ["HARNESSES", "REPOSITORIES", "ROWS", "Repository", "Row", "checkout_commit"]


@dataclass(frozen=True)
class Repository:
    folder: str  # the checkout's folder name under --checkouts
    url: str
    commit: str  # the commit the documented table was run on
    pinned: bool = True  # one of the nine: its environment is a row of the compatibility matrix (benchmarks.compat)


REPOSITORIES: Dict[str, Repository] = {r.folder: r for r in (
    Repository("FlyGCL", "https://github.com/AnAppleCore/FlyGCL", "79a6b51b7d21748dbdc3f981f474f1e3b0f33e0d"),
    Repository("Si-Blurry", "https://github.com/KHU-AGI/Si-Blurry", "c90d6d7dc4bf7805ffd4800f6dddeab51336f3a7"),
    Repository("MISA", "https://github.com/kangzhiq/MISA", "3308d67e5e08c233ea78e70b507716e9a4417002"),
    Repository("l2p-pytorch", "https://github.com/JH-LEE-KR/l2p-pytorch", "f7bc994365f51221e059b7be18c9b08c369444e6"),
    Repository("dualprompt-pytorch", "https://github.com/JH-LEE-KR/dualprompt-pytorch",
               "7eb457d988409a6abf97af2b121ffa62dd4b498a"),
    Repository("HiDe-Prompt", "https://github.com/thu-ml/HiDe-Prompt", "0ed433334ff2cfb206c5e2899651c3044ec85f92"),
    Repository("MoE_PromptCL", "https://github.com/Minhchuyentoancbn/MoE_PromptCL",
               "e418337fe9af0b34dba0fbb2de0f60b983ccf8ad"),
    Repository("mammoth", "https://github.com/aimagelab/mammoth", "e75a491c69fd729edeb01431afb753d9157d9a81"),
    Repository("LAMDA-PILOT", "https://github.com/LAMDA-CL/LAMDA-PILOT", "5240714d3d6071aca824f8aed4a92a46ac6f883c"),
    # Outside the nine, retrofitted through the generic seams only.
    Repository("prompt-gradient-projection", "https://github.com/JingyangQiao/prompt-gradient-projection",
               "c566b81f1abb19f8350da3fb71149ca9b8061a13", pinned=False),
    Repository("S-Prompts", "https://github.com/iamwangyabin/S-Prompts", "a26e822ae1b139d7bc7663740ea5a951b12be250", pinned=False),
    Repository("InfLoRA", "https://github.com/liangyanshuo/InfLoRA", "e08b00edd54f2f10cf2f9826eae7d44fdcb6354b", pinned=False),
    Repository("HiDe-PET", "https://github.com/thu-ml/HiDe-PET", "581170286e8e5ed2a7f4b6178279940ff3de1ee1", pinned=False),
)}

# harness module (benchmarks/upstream/harnesses/<name>.py) -> checkout folder
HARNESSES: Dict[str, str] = {
    "l2p_pytorch_l2p": "l2p-pytorch", "flygcl_l2p": "FlyGCL", "mammoth_l2p": "mammoth", "pilot_l2p": "LAMDA-PILOT",
    "dualprompt_pytorch_dualprompt": "dualprompt-pytorch", "flygcl_dualprompt": "FlyGCL",
    "mammoth_dualprompt": "mammoth", "pilot_dualprompt": "LAMDA-PILOT", "siblurry_dualprompt": "Si-Blurry",
    "misa_dualprompt": "MISA", "flygcl_mvp": "FlyGCL", "siblurry_mvp": "Si-Blurry", "misa_mvp": "MISA",
    "hide_prompt_hide": "HiDe-Prompt", "moe_promptcl_hide": "MoE_PromptCL", "moe_promptcl_norga": "MoE_PromptCL",
    "flygcl_sprompt": "FlyGCL", "flygcl_hide": "FlyGCL", "flygcl_norga": "FlyGCL", "flygcl_coda_prompt": "FlyGCL",
    "flygcl_hide_lora": "FlyGCL", "flygcl_hide_adapter": "FlyGCL", "flygcl_sdlora": "FlyGCL",
    "mammoth_coda_prompt": "mammoth", "pilot_coda_prompt": "LAMDA-PILOT",
    "pgp_l2p": "prompt-gradient-projection", "sprompts_sinet": "S-Prompts", "inflora_sinet": "InfLoRA",
    "hide_pet_lora": "HiDe-PET",
}


@dataclass(frozen=True)
class Row:
    """One row of the table; ``{adapters}`` in a cell is the path of docs/adapters.md from where it is shown."""

    method: str
    repository: str
    target: str
    replaces: str
    harnesses: Tuple[str, ...]


_L2P = "pool-wide top-k key match → top-k inside the routed slice"
_DUALPROMPT = "pool-wide E-prompt key match → key match inside the routed step's slots"
_MVP = "count-scaled key match → the routed prompt"
_HIDE = "TII class → task mapping → the routed task"
_MAMMOTH, _PILOT = "`continual_model.net.model`", "`learner._network.backbone`"

ROWS: Tuple[Row, ...] = (
    Row("`l2p`", "JH-LEE-KR/l2p-pytorch", "`model`", _L2P, ("l2p_pytorch_l2p",)),
    Row("`l2p`", "AnAppleCore/FlyGCL (`L2P`)", "`model`", _L2P + " (`s, e`)", ("flygcl_l2p",)),
    Row("`l2p`", "aimagelab/mammoth (`l2p`)", _MAMMOTH, "as l2p-pytorch", ("mammoth_l2p",)),
    Row("`l2p`", "LAMDA-CL/LAMDA-PILOT (`l2p`)", _PILOT, "as l2p-pytorch", ("pilot_l2p",)),
    Row("`dualprompt`", "JH-LEE-KR/dualprompt-pytorch", "`model`", _DUALPROMPT, ("dualprompt_pytorch_dualprompt",)),
    Row("`dualprompt`", "AnAppleCore/FlyGCL (`DualPrompt`)", "`model`", _DUALPROMPT + " (`s, e`)",
        ("flygcl_dualprompt",)),
    Row("`dualprompt`", "aimagelab/mammoth (`dualprompt`)", _MAMMOTH, "as dualprompt-pytorch", ("mammoth_dualprompt",)),
    Row("`dualprompt`", "LAMDA-CL/LAMDA-PILOT (`dualprompt`)", _PILOT, "as dualprompt-pytorch", ("pilot_dualprompt",)),
    Row("`dualprompt`", "KHU-AGI/Si-Blurry (`DualPrompt`)", "`model`",
        "nothing: `router=True` refused (no slot range, no step owns a prompt)", ("siblurry_dualprompt",)),
    Row("`misa`", "kangzhiq/MISA (`DualPrompt`)", "`model`",
        "nothing: `router=True` refused (slice-local prompt gather)", ("misa_dualprompt",)),
    Row("`mvp`", "AnAppleCore/FlyGCL (`MVP`)", "`model`", _MVP, ("flygcl_mvp",)),
    Row("`mvp`", "KHU-AGI/Si-Blurry (`MVP`)", "`model`", _MVP, ("siblurry_mvp",)),
    Row("`mvp`", "kangzhiq/MISA (`MVP`)", "`model`", _MVP, ("misa_mvp",)),
    Row("`hide`", "thu-ml/HiDe-Prompt", "`model` (+ `original_model`)", _HIDE, ("hide_prompt_hide",)),
    Row("`hide`", "Minhchuyentoancbn/MoE_PromptCL (HiDe)", "`model` (+ `original_model`)", _HIDE,
        ("moe_promptcl_hide",)),
    Row("`norga`", "Minhchuyentoancbn/MoE_PromptCL (NoRGa)", "`model` (+ `original_model`)", _HIDE,
        ("moe_promptcl_norga",)),
    Row("`sprompt`", "AnAppleCore/FlyGCL (`SPrompt`)", "`model`",
        "nearest task prototype → the routed task's prompts (`expert_ids`)", ("flygcl_sprompt",)),
    Row("`hide`", "AnAppleCore/FlyGCL (`HiDePrefixModel`)", "`model`",
        "gate class → first-task mapping → the routed task (`forward_prompt`'s `task_id`)", ("flygcl_hide",)),
    Row("`norga`", "AnAppleCore/FlyGCL (`NoRGaPrefixModel`)", "`model`",
        "gate class → first-task mapping → the routed task (`forward_prompt`'s `task_id`)", ("flygcl_norga",)),
    Row("`hide`", "AnAppleCore/FlyGCL (`HiDeLoRAModel`)", "`model`",
        "gate class → first-task mapping → the routed task's LoRA experts (`forward_prompt`'s `task_id`)",
        ("flygcl_hide_lora",)),
    Row("`hide`", "AnAppleCore/FlyGCL (`HiDeAdapterModel`)", "`model`",
        "gate class → first-task mapping → the routed task's adapters (`forward_prompt`'s `task_id`)",
        ("flygcl_hide_adapter",)),
    Row("`sdlora`", "AnAppleCore/FlyGCL (`SDLoRAModel`)", "`model`",
        "nothing: `router=True` refused (every task's directions serve every sample)", ("flygcl_sdlora",)),
    Row("`coda_prompt`", "AnAppleCore/FlyGCL (`CodaPrompt`)", "`model`",
        "the current task's component window → the routed task's window ([how]({adapters}#coda-prompt))",
        ("flygcl_coda_prompt",)),
    Row("—", "aimagelab/mammoth, LAMDA-CL/LAMDA-PILOT (`coda_prompt`)", "—",
        "not supported: refused by every family ([why]({adapters}#coda-prompt))",
        ("mammoth_coda_prompt", "pilot_coda_prompt")),
    Row("`generic`", "JingyangQiao/prompt-gradient-projection (`l2p-pgp`)", "`model` (6 lines of user code)",
        "pool-wide top-k key match → the routed slice (`Prompt.forward`'s `prompt_mask`)", ("pgp_l2p",)),
    Row("`generic`", "thu-ml/HiDe-PET (HiDe-LoRA)", "`model` (+ `original_model`; 5 lines of user code)",
        "TII class → task mapping → the routed task's LoRA (the model's `task_id`)", ("hide_pet_lora",)),
    Row("`generic`", "iamwangyabin/S-Prompts (`SiNet`)", "`learner._network` (7 lines of user code)",
        "nearest domain key → the routed domain (`interface(image, selection)`), per-domain `classifier_pool`",
        ("sprompts_sinet",)),
    Row("`generic`", "liangyanshuo/InfLoRA (`SiNet`)", "`learner._network` (4 lines of user code)",
        "nothing: no per-sample selection (every sample uses every task's LoRA); the ensemble over "
        "`classifier_pool`", ("inflora_sinet",)),
)
