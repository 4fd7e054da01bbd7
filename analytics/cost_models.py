"""Where a GPU-hour's rate comes from: the cost models that produce a rate card's rates, each with its workings.

- On-premises (`kind = "on_prem"`): the purchase price amortised over the card's life, plus power (the GPU's
  average draw and its share of the rest of the node's, times the data centre's PUE, at the electricity price),
  plus the node's monthly overhead (rack, network, support) shared by its GPUs.
- Cloud (`kind = "cloud"`): an instance type's hourly price (on-demand, reserved or committed, or spot, as the
  site buys it) over the GPUs in the instance.
A model's rate becomes the GPU model's undated rate, or, with `from`, a dated version of the rate card (so a new
contract prices only the hours after it). Every derived rate keeps its workings (`basis`), shown with the rate
card in `/v1/costs` and `GET /v1/rates`, so a finance team can check the arithmetic.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

HOURS_PER_YEAR = 365.25 * 24  # 8,766: leap years included
HOURS_PER_MONTH = HOURS_PER_YEAR / 12  # 730.5
COST_MODEL_KINDS = ("on_prem", "cloud")
CLOUD_PRICING = ("on_demand", "reserved", "spot")


@dataclass(frozen=True)
class OnPrem:
    """A GPU bought and run in the site's own data centre."""
    purchase_usd: float  # per GPU: its share of the server's price
    life_years: float
    power_w: float  # the GPU's average draw
    node_power_w: float = 0.0  # the rest of the node's draw (CPUs, memory, fans, NICs), shared by its GPUs
    gpus_per_node: float = 8.0
    usd_per_kwh: float = 0.12
    pue: float = 1.4  # power usage effectiveness: the facility's draw per watt the IT equipment draws
    node_overhead_usd_per_month: float = 0.0  # rack space, network, support, staff time per node

    def parts(self) -> dict[str, float]:
        """USD per GPU-hour by part."""
        watts = self.power_w + self.node_power_w / self.gpus_per_node
        return {"amortisation": self.purchase_usd / (self.life_years * HOURS_PER_YEAR),
                "power": watts / 1000.0 * self.pue * self.usd_per_kwh,
                "overhead": self.node_overhead_usd_per_month / (HOURS_PER_MONTH * self.gpus_per_node)}

    def rate(self) -> float:
        return sum(self.parts().values())

    def basis(self) -> str:
        p = self.parts()
        watts = self.power_w + self.node_power_w / self.gpus_per_node
        return (f"on-premises: ${self.purchase_usd:,.2f} over {self.life_years:g} years "
                f"({self.life_years * HOURS_PER_YEAR:,.0f} h) = ${p['amortisation']:.4f}/h; power "
                f"({self.power_w:g} W + {self.node_power_w:g} W / {self.gpus_per_node:g} GPUs) = {watts:g} W x PUE "
                f"{self.pue:g} x ${self.usd_per_kwh:g}/kWh = ${p['power']:.4f}/h; overhead "
                f"${self.node_overhead_usd_per_month:,.2f}/month / ({HOURS_PER_MONTH:g} h x {self.gpus_per_node:g} "
                f"GPUs) = ${p['overhead']:.4f}/h; total ${self.rate():.4f}/GPU-hour")


@dataclass(frozen=True)
class Cloud:
    """A GPU rented as part of a cloud instance."""
    instance_type: str
    gpus_per_instance: float
    pricing: str  # one of CLOUD_PRICING: how the site buys it
    usd_per_hour: dict[str, float]  # the instance's price per pricing option given

    def rate(self) -> float:
        return self.usd_per_hour[self.pricing] / self.gpus_per_instance

    def basis(self) -> str:
        return (f"cloud: {self.instance_type} {self.pricing.replace('_', '-')} ${self.usd_per_hour[self.pricing]:,.4f}"
                f"/h / {self.gpus_per_instance:g} GPUs = ${self.rate():.4f}/GPU-hour")


@dataclass(frozen=True)
class CostModel:
    """One `[cost_models."<GPU model>"]` entry: the GPU model it prices, its model, its start (None: undated) and
    the variant of the rate it gives ('' the model's own; `pool <name>` from `[cost_models."<model>".pools.<name>]`:
    two node pools of one GPU model, bought differently, cost differently)."""
    gpu_model: str
    model: OnPrem | Cloud
    start: datetime | None = None
    variant: str = ""

    def row(self) -> dict[str, Any]:
        return {"gpu_model": self.gpu_model, "usd_per_gpu_hour": self.model.rate(), "basis": self.model.basis(),
                "start": self.start, "variant": self.variant}
