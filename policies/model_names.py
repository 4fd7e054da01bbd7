"""GPU model names as people and gpuledger's own output write them, read back as the rate card's: `H100`, `h100`
(the Kueue flavor gpuledger emits), `a100-80gb`, `A100-80GB` all name one model. One rule for every input that
takes a model (placement, the what-if's edits and capacity), so a name the product printed is never refused."""
from __future__ import annotations

from collections.abc import Iterable

from gpuledger.collector.errors import InputError
from gpuledger.collector.gpu_catalog import MODELS, normalize_model
from gpuledger.policies.quota_plan import k8s_name


def _flavor(name: str) -> str | None:
    """The Kueue flavor name gpuledger emits for a model (policies/emitters/kueue.py); None for a name with no
    character a Kubernetes name can use."""
    try:
        return k8s_name(name)
    except InputError:
        return None


class ModelNames:
    """Every way to name the catalogue's models and those present, each to its rate-card name (the catalogue's
    wins a clash)."""

    def __init__(self, present: Iterable[str]) -> None:
        self.present = sorted({str(m) for m in present})
        self._known: dict[str, str] = {}
        for name in [*MODELS, *self.present]:
            for key in (name.lower(), _flavor(name)):
                if key:
                    self._known.setdefault(key, name)

    def find(self, name: str) -> str | None:
        """The model `name` names, or None. A driver's or node label's product name (`NVIDIA-H100-80GB-HBM3`, the
        `nvidia.com/gpu.product` value the Kueue plan's flavors select on) reads as its catalogue model."""
        found = self._known.get(name.strip().lower()) or self._known.get(_flavor(name) or "")
        if found is None:
            product = normalize_model(name)
            found = product if product != name.strip() and product in MODELS else None
        return found

    def resolve(self, name: str) -> str:
        """The model `name` names, or the name as given (a model neither known nor present: the caller says so)."""
        return self.find(name) or name

    def require(self, names: Iterable[str]) -> frozenset[str]:
        """The models `names` name; an unknown one is refused naming the models present."""
        found, unknown = set(), []
        for name in names:
            model = self.find(name)
            if model is None:
                unknown.append(name)
            else:
                found.add(model)
        if unknown:
            raise InputError(f"unknown GPU model {', '.join(repr(n) for n in unknown)}: the models present are "
                             f"{', '.join(self.present) or 'none (no node has reported)'}; name one as the rate "
                             f"card does (H100, A100-80GB), as its Kueue flavor (h100, a100-80gb) or as its "
                             f"product name (NVIDIA-H100-80GB-HBM3)")
        return frozenset(found)
