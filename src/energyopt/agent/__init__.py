"""The node agent: one privileged service per node that holds NVML, applies plans and
the online control's clock and power-limit changes within the operator's policy, and
exports what every GPU draws to Prometheus. See docs/agent.md.

``AgentClient`` talks to it over its Unix socket; ``Refused`` is what a refusal raises.
"""

from energyopt.agent.client import AgentClient, AgentUnavailable
from energyopt.agent.policy import Policy, load_policy
from energyopt.agent.protocol import MAX_MESSAGE_BYTES, PROTOCOL_VERSION, Refused

__all__ = [
    "MAX_MESSAGE_BYTES",
    "PROTOCOL_VERSION",
    "AgentClient",
    "AgentUnavailable",
    "Policy",
    "Refused",
    "load_policy",
]
