"""The weight maps of the task-expert methods (HiDe-LoRA, HiDe-Adapter, SD-LoRA): the official code keeps
one module per block and task, ours one bank per task stacking its blocks, so each official tensor is a
view ``[block, ...]`` into one of ours (``measures.tensor``)."""

from __future__ import annotations

from typing import Dict

__all__ = ["EXPERT_BLOCKS", "HIDE_HEADS", "hide_adapter_weights", "hide_lora_weights", "sd_lora_weights"]

#: the blocks holding experts: the official runs' 5 (``--num_*_layers``, ``--sdlora_layers all``), all of
#: the fidelity ViT's depth
EXPERT_BLOCKS = 5

#: HiDe's prompt (task-adaptive) head and gate branch, official name -> ours
HIDE_HEADS = {f"{module}.{kind}": f"{ours}.{kind}" for module, ours in
              (("prompt_head", "head"), ("g_mlp.0", "g_mlp.0"), ("g_head", "g_head")) for kind in ("weight", "bias")}


def hide_lora_weights(tasks: int) -> Dict[str, str]:
    """``lora_expert.lora_{k,v}.<block>.<task>.lora_{A,B}`` -> ``lora.banks.<task>.{down,up}[block,k|v]``."""
    return {
        f"lora_expert.lora_{kv}.{block}.{task}.lora_{ab}": f"lora.banks.{task}.{part}[{block},{j}]"
        for task in range(tasks) for block in range(EXPERT_BLOCKS)
        for j, kv in enumerate("kv") for ab, part in (("A", "down"), ("B", "up"))
    } | HIDE_HEADS


def hide_adapter_weights(tasks: int) -> Dict[str, str]:
    """``adapter_expert.adapters.<block>.<task>.{down,up}_proj.*``, ``.scale`` -> ``adapter.banks.<task>``."""
    weights = {}
    for task in range(tasks):
        for block in range(EXPERT_BLOCKS):
            theirs, ours = f"adapter_expert.adapters.{block}.{task}", f"adapter.banks.{task}"
            for projection in ("down", "up"):
                for kind in ("weight", "bias"):
                    weights[f"{theirs}.{projection}_proj.{kind}"] = f"{ours}.{projection}_{kind}[{block}]"
            weights[f"{theirs}.scale"] = f"{ours}.scale[{block}:{block + 1}]"
    return weights | HIDE_HEADS


def sd_lora_weights(tasks: int) -> Dict[str, str]:
    """``backbone.blocks.<block>.attn.qkv.{A,B,alpha}_{q,v}.<task>`` -> ``banks.<task>.{down,up,magnitude}``,
    and the classifier ``backbone.fc`` -> ``head``."""
    weights = {"backbone.fc.weight": "head.weight", "backbone.fc.bias": "head.bias"}
    for task in range(tasks):
        for block in range(EXPERT_BLOCKS):
            qkv = f"backbone.blocks.{block}.attn.qkv"
            for j, qv in enumerate("qv"):
                weights[f"{qkv}.A_{qv}.{task}.weight"] = f"banks.{task}.down[{block},{j}]"
                weights[f"{qkv}.B_{qv}.{task}.weight"] = f"banks.{task}.up[{block},{j}]"
                weights[f"{qkv}.alpha_{qv}.{task}"] = f"banks.{task}.magnitude[{block},{j}:{j + 1}]"
    return weights
