"""The length head's own learning rate: a second AdamW parameter group in SpecForge's optimizer.

The drafting recipes' learning rates (1e-4 on GPUs, 1e-3 on the CPU) are tuned for the draft
decoder; at those rates the small length MLP moves too little in the few hundred steps of a run to
learn what the prompt says about the length. SpecForge builds one ``BF16Optimizer``
(AdamW over fp32 master copies, one group, the run's warm-up and decay) through
``specforge.training.assembly._optimizer_factory`` and offers no provider hook for it, so
:func:`install_length_head_lr` points that factory at one that builds the same optimizer and moves
the head's master copies into a group at ``length_head_lr_scale`` times the run's rate; one
schedule scales both groups.
"""

from __future__ import annotations

import torch

from specforge_outlets.errors import OutletsError


def head_parameter_group(optimizer, module: torch.nn.Module, lr_scale: float, *, total_steps: int,
                         warmup_steps: int) -> None:
    """Regroup a built ``BF16Optimizer`` of ``module``: the length head (and the quantile head) at ``lr_scale`` x lr, the
    schedule rebuilt as SpecForge built it (same class, steps and warm-up).

    Names are matched through DDP/FSDP wrappers (``use_orig_params`` keeps them).
    """
    head = {id(p) for name, p in module.named_parameters()
            if ".length_head." in f".{name}" or ".quantile_head." in f".{name}"}
    rest, head_masters = [], []
    for param, master in zip(optimizer.model_params, optimizer.fp32_params):
        (head_masters if id(param) in head else rest).append(master)
    assert head_masters, "no length_head parameters among the optimizer's"
    old, scheduler = optimizer.optimizer, optimizer.scheduler
    lr = old.defaults["lr"]
    optimizer.optimizer = torch.optim.AdamW(
        [{"params": rest}, {"params": head_masters, "lr": lr * lr_scale}],
        lr=lr,
        weight_decay=old.defaults["weight_decay"],
    )
    optimizer.scheduler = type(scheduler)(optimizer.optimizer, total_steps=total_steps, warmup_steps=warmup_steps)


def check_resumed_groups(optimizer, lr_scale: float) -> None:
    """Make a resume whose checkpoint grouped the head differently fail naming the setting to resume with.

    Without this, torch says only "loaded state dict has a different number of parameter groups".
    The checkpoint's scale is read off its groups' learning rates (one schedule scales both).
    """
    load = optimizer.load_state_dict

    def load_state_dict(state_dict):
        groups = state_dict["optimizer_state_dict"]["param_groups"]
        if len(groups) != len(optimizer.optimizer.param_groups):
            saved = groups[1]["lr"] / groups[0]["lr"] if len(groups) == 2 and groups[0]["lr"] else 1.0
            raise OutletsError(
                f"the checkpoint was trained with outlets.length_head_lr_scale={saved:g} ({len(groups)} optimizer "
                f"group(s)); this run has {lr_scale:g}: resume with outlets.length_head_lr_scale={saved:g}, "
                "or start a new output_dir")
        load(state_dict)

    optimizer.load_state_dict = load_state_dict


def install_length_head_lr(lr_scale: float) -> None:
    """Make SpecForge's trainer build its optimizer with the head's group (idempotent)."""
    from specforge.training import assembly

    class HeadGroupOptimizerFactory(assembly._ConfiguredOptimizerFactory):
        def __call__(self, draft_module):
            optimizer = super().__call__(draft_module)
            if lr_scale != 1.0:
                head_parameter_group(
                    optimizer,
                    draft_module,
                    lr_scale,
                    total_steps=self.total_steps,
                    warmup_steps=int(self.cfg.training.warmup_ratio * self.total_steps),
                )
            check_resumed_groups(optimizer, lr_scale)
            return optimizer

    assembly._optimizer_factory = HeadGroupOptimizerFactory
