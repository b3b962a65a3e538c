"""Attribution patching (Nanda 2023): activation patching's scans estimated from one backward pass.

Activation patching (patching.py) reruns the corrupted sentence once per site: heads x layers plus
positions x encoder layers forward passes. Attribution patching expands p (the probability of the
predicted token at the focus row) to first order around the corrupted run instead:

    p_patched(site) − p_corrupt  ≈  Σ (a_clean − a_corrupt) · ∂p/∂a |corrupted run

summed over the elements the patch replaces (a head's output at every target row; one encoder position's
vector). One clean forward records every site, one corrupted forward keeps the graph, one backward gives
every site's gradient: the whole scan costs three passes, whatever the model's size. The estimate is exact
when p is linear in the site's value and drifts as the patch moves p far (a saturating softmax): compare
with the real scan before trusting a cell (`correlation`, docs/attribution.md).

The scans have activation patching's shape (`patch_scan`), so the table, the JSON and the lab's view read
either; "all heads" and "all positions" are the sums of the single estimates (first order is additive).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .patch_sites import FLAT, Patched, scan_sites


def _probability(logits: Tensor, row: int, token: int) -> Tensor:
    return torch.softmax(logits[0, row].double(), dim=-1)[token]


def approximate_scan(model, clean_src: Tensor, corrupt_src: Tensor, tgt_in: Tensor, row: int, token: int, *,
                     positions: bool = True) -> dict[str, Any]:
    """`patch_scan`'s result, every cell estimated from the clean and corrupted values and the corrupted
    run's gradient of p(token) at `row` (arguments as patch_scan's)."""
    heads, every_head, layers = scan_sites(model, clean_src, corrupt_src, tgt_in, row, positions)
    sites = [*every_head, *layers]

    with torch.no_grad(), model.probes(*sites) as rec:                       # the same (math) attention path
        p_clean = float(_probability(model(clean_src, tgt_in), row, token))
    clean = {name: rec[name] for name in sites}

    kept: dict[str, Tensor] = {}

    def keep(value: Tensor, name: str) -> Tensor:
        """The corrupted run's value at a site, kept in the graph (a leaf where nothing upstream needs grad)."""
        if not value.requires_grad:
            value = value.detach().requires_grad_(True)
        kept[name] = value
        return value

    with torch.enable_grad(), model.intervene({name: keep for name in sites}):
        p = _probability(model(corrupt_src, tgt_in), row, token)
    grads = dict(zip(sites, torch.autograd.grad(p, [kept[name] for name in sites], allow_unused=True),
                     strict=True))
    p_corrupt = float(p.detach())
    gap = p_clean - p_corrupt

    def delta(name: str) -> Tensor:
        """(a_clean − a_corrupt) · ∂p/∂a, element by element, for a site (zeros where p does not depend on it)."""
        grad = grads[name]
        if grad is None:
            return torch.zeros_like(clean[name], dtype=torch.float64)
        return (clean[name] - kept[name].detach()).double() * grad.double()

    def cell(estimate: float) -> Patched:
        return Patched(p_corrupt + estimate, estimate / gap if abs(gap) >= FLAT else None)

    head_estimates = [[float(delta(name).sum()) for name in layer] for layer in heads]
    result: dict[str, Any] = {
        "p_clean": p_clean, "p_corrupt": p_corrupt,
        "heads": [[cell(e) for e in layer] for layer in head_estimates],
        "all_heads": cell(sum(e for layer in head_estimates for e in layer)),
        "nothing": cell(0.0),
        "position_layers": layers,
        "positions": None,
    }
    if positions:
        per_position = [delta(name).sum(dim=-1)[0] for name in layers]     # (src,) per layer
        result["positions"] = [[cell(float(e)) for e in estimates] for estimates in per_position]
        result["all_positions"] = [cell(float(estimates.sum())) for estimates in per_position]
    return result


def correlation(approximate: dict[str, Any], activation: dict[str, Any]) -> float | None:
    """Pearson correlation of the two scans' restored fractions over every head and every position cell
    (JSON scans as lesson_patching writes them); None when a side has no spread or no fractions."""
    def cells(scan: dict[str, Any]) -> list[float | None]:
        values = [p["fraction"] for layer in scan["heads"] for p in layer]
        for layer in scan.get("positions") or []:
            values += [p["fraction"] for p in layer]
        return values

    pairs = [(a, b) for a, b in zip(cells(approximate), cells(activation), strict=True)
             if a is not None and b is not None]
    if len(pairs) < 2:
        return None
    x = torch.tensor(pairs, dtype=torch.float64)
    x = x - x.mean(dim=0)
    norms = x.norm(dim=0)
    if bool((norms < 1e-12).any()):
        return None
    return float((x[:, 0] * x[:, 1]).sum() / (norms[0] * norms[1]))
