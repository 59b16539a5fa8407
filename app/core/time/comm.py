"""Communication per parallel dimension, on the link it really uses.

Placement. Megatron numbers ranks with TP innermost: the dense grid in the order
``tp-cp-dp-pp`` and the expert grid ``etp-ep-edp-pp`` (NVIDIA/Megatron-LM
``megatron/core/parallel_state.py`` ``initialize_model_parallel``, default ``order="tp-cp-ep-dp-pp"``,
``RankGenerator``). A group of ``n`` ranks whose members are ``stride`` apart therefore has
``m = min(n, D // stride)`` members in each NVLink domain of ``D`` GPUs (``m = 1`` when
``stride >= D``): the whole group is inside one domain when ``n * stride <= D``; otherwise it
spans ``n / m`` domains and its traffic between domains is network-bound. Strides: TP 1, CP TP,
DP (with CP: the distributed optimizer's ``dp_cp`` group) TP, PP TP*CP*DP, EP ETP, EDP ETP*EP.

Collectives on a group of ``n`` ranks, ``m`` per domain, for a buffer of ``X`` bytes per GPU
(the all-gather output / reduce-scatter input), hierarchically (NCCL's NVLS / tree behaviour):

* reduce-scatter or all-gather: ``(m-1)/m * X`` over NVLink, then ``(k-1)/k * X/m`` over each
  GPU's NIC, ``k = n/m`` domains; the two phases add;
* all-reduce: twice a reduce-scatter;
* all-to-all (EP dispatch / combine, ``X`` = what one GPU sends in all): ``X (m-1)/n`` to peers in
  the domain over NVLink and ``X (n-m)/n`` to the others over the NIC, concurrently (the slower
  one counts);
* point-to-point (PP, CP ring): ``X`` over NVLink when the peer is in the domain, else the NIC.

Each collective pays one latency per link level it uses. Rates are the link's unidirectional
bandwidth (:class:`app.core.model.hardware.Hardware`) times the achieved fraction of
:mod:`app.core.time.efficiency`.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.core.model.hardware import Hardware
from app.core.time.efficiency import Efficiency


@dataclass(frozen=True)
class Group:
    """One process group's size and placement."""

    dim: str
    size: int
    stride: int
    domain: int

    @property
    def per_domain(self) -> int:
        if self.size <= 1:
            return 1
        if self.stride >= self.domain:
            return 1
        return max(1, min(self.size, self.domain // self.stride))

    @property
    def domains(self) -> int:
        return -(-self.size // self.per_domain)

    @property
    def link(self) -> str:
        """``none`` (one rank), ``nvlink`` (inside one domain), ``network`` or ``mixed``."""
        if self.size <= 1:
            return "none"
        if self.domains == 1:
            return "nvlink"
        return "network" if self.per_domain == 1 else "mixed"

    def to_dict(self) -> dict[str, object]:
        return {"dim": self.dim, "size": self.size, "stride": self.stride, "per_domain": self.per_domain,
                "domains": self.domains, "link": self.link}


def groups(*, tp: int, cp: int, dp: int, pp: int, ep: int, etp: int, domain: int) -> dict[str, Group]:
    """Every process group of a launch, placed (module docstring)."""
    world = tp * cp * dp * pp
    edp = world // (etp * ep * pp)
    return {
        "tp": Group("tp", tp, 1, domain),
        "cp": Group("cp", cp, tp, domain),
        "dp": Group("dp", dp * cp, tp, domain),
        "pp": Group("pp", pp, tp * cp * dp, domain),
        "ep": Group("ep", ep, etp, domain),
        "etp": Group("etp", etp, 1, domain),
        "edp": Group("edp", edp, etp * ep, domain),
    }


def reduce_scatter(g: Group, nbytes: float, hw: Hardware, eff: Efficiency) -> float:
    """Seconds for a reduce-scatter (or all-gather) of ``nbytes`` per GPU on ``g``."""
    if g.size <= 1 or nbytes <= 0:
        return 0.0
    m, k = g.per_domain, g.domains
    t = 0.0
    if m > 1:
        t += (m - 1) / m * nbytes / (hw.nvlink_bw * eff.nvlink) + eff.lat_nvlink
    if k > 1:
        t += (k - 1) / k * nbytes / m / (hw.net_bw * eff.net) + eff.lat_net
    return t


all_gather = reduce_scatter


def all_reduce(g: Group, nbytes: float, hw: Hardware, eff: Efficiency) -> float:
    return 2.0 * reduce_scatter(g, nbytes, hw, eff)


def remote_domains_per_token(g: Group, topk: int, experts: int) -> float:
    """Expected number of *other* NVLink domains one token's ``topk`` experts fall in, with the
    ``experts`` spread evenly over the group's domains and routing balanced (uniform without
    replacement): ``(k - 1) * (1 - C(E - E/k, topk) / C(E, topk))`` for ``k`` domains."""
    k = g.domains
    if k <= 1 or experts <= 0 or topk <= 0:
        return 0.0
    per = experts / k
    miss = 1.0
    for j in range(topk):  # P(no chosen expert in a given remote domain)
        miss *= max(0.0, (experts - per - j) / (experts - j))
    return (k - 1) * (1.0 - miss)


def all_to_all(g: Group, nbytes: float, hw: Hardware, eff: Efficiency, *, topk: int = 0, experts: int = 0) -> float:
    """Seconds for an all-to-all where each GPU sends ``nbytes`` in all (its share for itself
    included, as a balanced router spreads tokens evenly).

    For an MoE dispatch / combine (``topk`` and ``experts`` given) the traffic that leaves the NVLink
    domain is de-duplicated per destination domain, as the hierarchical dispatchers do (DeepEP's
    internode kernels and Megatron's HybridEP send a token once per remote node and fan it out
    over NVLink there; deepseek-ai/DeepEP ``README.md`` / ``docs/legacy.md`` @ dd758caf): a GPU
    sends ``nbytes / topk`` per remote domain its token reaches
    (:func:`remote_domains_per_token`) over its NIC, while NVLink carries the copies to the
    experts inside each domain."""
    n = g.size
    if n <= 1 or nbytes <= 0:
        return 0.0
    m = g.per_domain
    if topk and experts and g.domains > 1:
        outside = nbytes / topk * remote_domains_per_token(g, topk, experts)
        inside = nbytes * (n - 1) / n
    else:
        inside = nbytes * (m - 1) / n
        outside = nbytes * (n - m) / n
    t_in = inside / (hw.nvlink_bw * eff.a2a_nvlink) + (eff.lat_nvlink if m > 1 else 0.0)
    t_out = outside / (hw.net_bw * eff.a2a_net) + (eff.lat_net if n > m else 0.0)
    return max(t_in, t_out)


def p2p(g: Group, nbytes: float, hw: Hardware, eff: Efficiency) -> float:
    """Seconds to send ``nbytes`` to the next rank of ``g`` (PP neighbour, CP ring step)."""
    if g.size <= 1 or nbytes <= 0:
        return 0.0
    if g.stride < g.domain and g.per_domain > 1:
        return nbytes / (hw.nvlink_bw * eff.nvlink) + eff.lat_nvlink
    return nbytes / (hw.net_bw * eff.net) + eff.lat_net


def same_domain(g: Group, a: int, b: int) -> bool:
    """Whether members ``a`` and ``b`` (0-based positions in ``g``) share an NVLink domain, with
    groups laid out from rank 0 in domain-sized blocks."""
    return (a * g.stride) // g.domain == (b * g.stride) // g.domain


def p2p_between(g: Group, a: int, b: int, nbytes: float, hw: Hardware, eff: Efficiency) -> float:
    """Seconds to send ``nbytes`` from member ``a`` to member ``b`` of ``g`` (a PP boundary)."""
    if nbytes <= 0 or a == b:
        return 0.0
    if same_domain(g, a, b):
        return nbytes / (hw.nvlink_bw * eff.nvlink) + eff.lat_nvlink
    return nbytes / (hw.net_bw * eff.net) + eff.lat_net
