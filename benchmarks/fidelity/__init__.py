"""Fidelity of the reference methods (``benchmarks.methods``) to the official code: each method trained
side by side with the official model and trainer of a checkout the user names, from the same initial
weights on the same stream batches, then compared tensor by tensor and decision by decision
(docs/verification.md, "The reference methods against the official code").

* :mod:`.setting`: the tiny ViT, the stream and the training settings both sides share;
* :mod:`.pairs`: which official class each method is compared with, and the map of their tensors;
* :mod:`.official`, :mod:`.ours`: the two sides, each trained by its own code; :mod:`.flyprompt_state`,
  :mod:`.hide_state`: what FlyPrompt's and HiDe-Prompt's comparisons need beyond the tensors;
  :mod:`.expert_state`: the tensor maps of the task experts (HiDe-LoRA, HiDe-Adapter, SD-LoRA);
* :mod:`.evaluations`: the official trainer's evaluations at the runner's evaluation points;
* :mod:`.measures`: tensor differences and decision agreement; :mod:`.comparison`: one method end to end;
* :mod:`.row`, :mod:`.cli`: the table and the command line;
* :mod:`.misa_checkout`, :mod:`.misa_side`, :mod:`.misa_comparison`: the MISA rows (``--misa``), against
  kangzhiq/MISA's own model and trainer from its shipped prompts.
"""
