"""The agent's Prometheus endpoint (``prometheus_client``, the ``agent`` extra).

Readings are taken from NVML at each scrape (no lock is held, so a scrape never waits
for an apply). Per GPU (labels ``gpu`` = NVML index, ``uuid``, ``plan_gpu``):

=========================================  ==========================================
``energyopt_gpu_power_watts``              board power draw now (W)
``energyopt_gpu_energy_joules_total``      NVML energy counter since the driver loaded (J)
``energyopt_gpu_sm_clock_mhz``             SM clock now (MHz)
``energyopt_gpu_locked_clock_mhz``         locked SM clock range, ``bound`` = min or max
                                           (absent when unlocked or unreadable)
``energyopt_gpu_power_limit_watts``        power management limit (W)
``energyopt_gpu_mig_instances``            MIG GPU instances by ``profile``
``energyopt_gpu_plan_clock_mhz``           the plan in force's clock (MHz)
``energyopt_gpu_plan_power_limit_watts``   the plan in force's power limit (W)
``energyopt_gpu_predicted_power_watts``    the plan's predicted power, beside the measured
``energyopt_gpu_plan_share_percent``       the plan's share of each placement (``workload``,
                                           ``phase``, ``mig_profile``): the MPS layout (%)
``energyopt_gpu_online_change``            1 while an online change (boost) is in force
=========================================  ==========================================

and for the agent: ``energyopt_plan_info{plan_id}`` (1 while a plan is in force),
``energyopt_agent_requests_total{op}``, ``energyopt_agent_refusals_total{op,code}``,
``energyopt_agent_rollbacks_total``, ``energyopt_agent_watchdog_fallbacks_total``,
``energyopt_agent_heartbeat_age_seconds``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from energyopt.agent.service import Agent

_GPU = ["gpu", "uuid", "plan_gpu"]


class AgentCollector(Collector):
    """Reads the agent's GPUs and counters at each scrape."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    def collect(self) -> Iterator[Metric]:
        status = self.agent.status()
        g: dict[str, GaugeMetricFamily | CounterMetricFamily] = {
            "power": GaugeMetricFamily(
                "energyopt_gpu_power_watts", "Board power draw (W)", labels=_GPU
            ),
            "energy": CounterMetricFamily(
                "energyopt_gpu_energy_joules",
                "NVML energy counter since the driver was loaded (J)",
                labels=_GPU,
            ),
            "sm": GaugeMetricFamily("energyopt_gpu_sm_clock_mhz", "SM clock (MHz)", labels=_GPU),
            "locked": GaugeMetricFamily(
                "energyopt_gpu_locked_clock_mhz",
                "Locked SM clock range (MHz); absent when unlocked or unreadable",
                labels=[*_GPU, "bound"],
            ),
            "limit": GaugeMetricFamily(
                "energyopt_gpu_power_limit_watts", "Power management limit (W)", labels=_GPU
            ),
            "mig": GaugeMetricFamily(
                "energyopt_gpu_mig_instances",
                "MIG GPU instances by profile",
                labels=[*_GPU, "profile"],
            ),
            "plan_clock": GaugeMetricFamily(
                "energyopt_gpu_plan_clock_mhz", "The plan in force's SM clock (MHz)", labels=_GPU
            ),
            "plan_limit": GaugeMetricFamily(
                "energyopt_gpu_plan_power_limit_watts",
                "The plan in force's power limit (W)",
                labels=_GPU,
            ),
            "predicted": GaugeMetricFamily(
                "energyopt_gpu_predicted_power_watts",
                "The plan in force's predicted power of this GPU (W)",
                labels=_GPU,
            ),
            "share": GaugeMetricFamily(
                "energyopt_gpu_plan_share_percent",
                "The plan in force's share_pct of each placement (MPS active-thread "
                "percentage; a MIG placement's instance is its mig_profile) (%)",
                labels=[*_GPU, "workload", "phase", "mig_profile"],
            ),
            "online": GaugeMetricFamily(
                "energyopt_gpu_online_change",
                "1 while an online change of this setting differs from the plan",
                labels=[*_GPU, "setting"],
            ),
        }
        for row in status["gpus"]:
            labels = [str(row["index"]), row["uuid"], row["plan_gpu"] or ""]
            g["power"].add_metric(labels, row["power_w"])
            g["energy"].add_metric(labels, row["energy_j"])
            g["sm"].add_metric(labels, row["sm_clock_mhz"])
            locked = row["locked_clocks"]
            if isinstance(locked, tuple | list):
                g["locked"].add_metric([*labels, "min"], locked[0])
                g["locked"].add_metric([*labels, "max"], locked[1])
            g["limit"].add_metric(labels, row["power_limit_w"])
            for profile, count in _mig_profiles(row["mig"]).items():
                g["mig"].add_metric([*labels, profile], count)
            plan: dict[str, Any] | None = row.get("plan")
            if plan is not None:
                if plan["clock_mhz"] is not None:
                    g["plan_clock"].add_metric(labels, plan["clock_mhz"])
                if plan["power_limit_w"] is not None:
                    g["plan_limit"].add_metric(labels, plan["power_limit_w"])
                g["predicted"].add_metric(labels, plan["predicted_power_w"])
                for place in plan["placements"]:
                    g["share"].add_metric(
                        [*labels, place["workload"], place["phase"], place["mig"] or ""],
                        place["share_pct"],
                    )
            for setting in row["online"]:
                g["online"].add_metric([*labels, setting], 1)
        yield from g.values()
        info = GaugeMetricFamily(
            "energyopt_plan_info", "1 for the plan in force", labels=["plan_id"]
        )
        if status["plan_id"] is not None:
            info.add_metric([status["plan_id"]], 1)
        yield info
        stats = self.agent.stats
        requests = CounterMetricFamily(
            "energyopt_agent_requests", "Requests received, by operation", labels=["op"]
        )
        for op, n in sorted(stats.requests.items()):
            requests.add_metric([op], n)
        yield requests
        refusals = CounterMetricFamily(
            "energyopt_agent_refusals", "Requests refused, by operation and code",
            labels=["op", "code"],
        )
        for (op, code), n in sorted(stats.refusals.items()):
            refusals.add_metric([op, code], n)
        yield refusals
        yield CounterMetricFamily(
            "energyopt_agent_rollbacks", "Applies and online changes rolled back",
            value=stats.rollbacks,
        )
        yield CounterMetricFamily(
            "energyopt_agent_watchdog_fallbacks",
            "Times the watchdog returned the GPUs to the plan",
            value=stats.watchdog_fallbacks,
        )
        age = GaugeMetricFamily(
            "energyopt_agent_heartbeat_age_seconds",
            "Seconds since the controller's last heartbeat (absent before the first)",
        )
        if status["heartbeat_age_s"] is not None:
            age.add_metric([], status["heartbeat_age_s"])
        yield age


def _mig_profiles(mig: str) -> Counter[str]:
    """Instances by profile from ``gpu_status``'s MIG text (``on: 3g.40gb@0, 1g.10gb@4``)."""
    if not mig.startswith("on: "):
        return Counter()
    body = mig[4:].split(" (")[0]
    return Counter(p.split("@")[0] for p in body.split(", ") if "@" in p)


class MetricsServer:
    """The HTTP endpoint ``/metrics`` on ``addr:port`` (port 0: any free port)."""

    def __init__(self, agent: Agent, addr: str, port: int) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(AgentCollector(agent))
        self.httpd, self.thread = start_http_server(port, addr, self.registry)

    @property
    def port(self) -> int:
        """The port it listens on."""
        return int(self.httpd.server_address[1])

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop serving and join the thread."""
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout_s)
