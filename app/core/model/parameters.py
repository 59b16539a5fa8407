"""Parameter counts: per layer and per component, totals, activated per token, per stage and per GPU.

Formulas (FACTS.md section 4; HF ``DeepseekV3`` / ``GlmMoeDsa`` module shapes), with H hidden,
h heads, rq / rkv the q / kv LoRA ranks, dn / dr / dv the nope / rope / value head dims,
Hi / di the indexer heads / head dim, E / S routed / shared experts, i / I the expert / dense FFN
widths, V the vocabulary:

* MLA attention ``H*rq + rq + rq*h*(dn+dr) + H*(rkv+dr) + rkv + rkv*h*(dn+dv) + h*dv*H``
  (q_a_proj, q_a_layernorm, q_b_proj, kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj;
  without a q LoRA the query is one ``H*h*(dn+dr)`` projection);
* GQA / MHA attention (``attention == "gqa"``, d = ``head_dim``, g = ``num_key_value_heads``):
  q ``H*h*d``, k and v ``H*g*d`` each, o ``h*d*H`` (all TP-sharded); q/k/v biases ``h*d + 2*g*d``
  when the family has them (TP-sharded with their projection), an o_proj bias ``H`` (replicated:
  a row-parallel bias is added after the reduction), QK-norm ``2*d`` (replicated)
  (transformers ``LlamaAttention`` / ``Qwen2Attention`` / ``Qwen3Attention`` / ``Glm4MoeAttention``);
* layer norms ``2H`` (RMSNorm gains; LayerNorm with biases, ``norm_bias``: ``4H``, and the final
  norm ``2H``; Gemma 2's four norms a layer, ``norms_per_layer``: ``4H``, transformers
  ``Gemma2DecoderLayer``); learned position embeddings (``position_embeddings`` rows, GPT-2 ``wpe``) add
  ``P*H`` (replicated) to the embedding component, not to a tied head; indexer ``rq*Hi*di + H*di + H*Hi + 2*di`` (wq_b, wk, weights_proj, k_norm),
  **only on layers that own an indexer** (full layers and MTP layers);
* GPT-OSS (transformers ``modeling_gpt_oss.py``): an attention sink per head ``h``, biases on every
  expert's gate/up and down projections ``2*i + H``, a trained router bias ``E``;
* dense FFN ``3*H*I`` (gated SwiGLU); a 2-matrix MLP (GPT-2's GELU ``c_fc`` / ``c_proj``,
  ``gated_mlp=False``) ``2*H*I`` plus its biases ``I + H`` (gated: ``2I + H``) when ``mlp_bias``; one expert ``3*H*i``; routed experts ``E*3*H*i``; shared ``S*3*H*i``;
  router ``E*H`` (and Qwen2-MoE's shared-expert gate ``H``); router score-correction bias ``E`` (DeepSeek / GLM ``e_score_correction_bias``;
  checkpoint only, not a trained weight; none for Qwen3-MoE and Mixtral);
* a hybrid model (Nemotron-H, :mod:`app.core.model.hybrid`): a layer is its one norm and one module,
  a Mamba-2 mixer (``MambaDims.params``, TP-sharded), an attention block, an MoE block or a dense
  MLP; its experts and MLPs have two matrices (``2*H*i``); its MTP layer (an attention and an MoE
  block) has one norm more; LatentMoE (``moe_latent_size`` L): the routed experts take L instead of
  H (``3*L*i`` / ``2*L*i``) between the latent projections ``2*H*L`` (duplicated over TP, counted
  with the router's component as ``latent_proj``), the shared expert stays in H;
* embedding and lm_head ``V*H`` each (one when tied); final norm ``H``;
* an MTP layer: attention + norms + indexer + MoE + enorm/hnorm ``2H`` + eh_proj ``2H^2`` +
  shared-head norm ``H`` (it shares the embedding and the head).

Totals: ``main_total`` = decoder + embedding + head + final norm (no MTP, no router bias; 744B
published); ``checkpoint_total`` adds MTP layers and router biases (what the safetensors hold),
and for DeepSeek checkpoints the MTP module's own embedding and head copies
(:attr:`ModelConfig.mtp_stores_embedding_and_head`; DeepSeek-V3: 671B main + 14B MTP = 685B
published in deepseek-ai/DeepSeek-V3 ``README.md``; GLM checkpoints store none).
``active`` = per-token activated weights: attention, indexers, norms, dense FFN, ``top-k`` routed
plus shared experts, router, final norm and lm_head; no input embedding, no MTP.

Placement per pipeline stage follows the materialised stages: embedding on the stage holding
``E``; lm_head and final norm on the loss stage; MTP layers on their stage, which also holds its
own copy of the embedding (Megatron builds ``self.embedding`` when ``pre_process or
mtp_process``; NVIDIA/Megatron-LM ``megatron/core/models/gpt/gpt_model.py``).

Sharding per GPU (Megatron-Core conventions): TP splits the MLA up/out projections (q_b, kv_b,
o_proj) or the GQA q, k, v, o projections (and their q/k/v biases), the dense FFN, the shared expert and the vocabulary of embedding / lm_head; the MLA
down projections, their norms, the indexer (``parallel_mode="duplicated"``), the router and the
layer norms are replicated; routed experts are split EP ways by expert and ETP ways inside an
expert.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from app.core.content_cache import remember
from app.core.layout.stages import Stage, StagePlan
from app.core.model.config import ModelConfig
from app.core.model.roles import RoleMap, derive_roles

COMPONENTS = (
    "attention", "mamba", "gdn", "indexer", "norms", "dense_ffn", "routed_experts", "shared_expert", "router",
    "latent_proj", "router_bias", "embedding", "lm_head", "final_norm", "mtp",
)


@dataclass(frozen=True)
class Shapes:
    """Per-module parameter counts of one config, split into TP-sharded and replicated parts."""

    attn_sharded: int
    attn_replicated: int
    norms: int
    indexer: int
    dense_ffn: int
    expert: int
    routed_experts: int
    shared_expert: int
    router: int
    router_bias: int
    embedding: int
    lm_head: int
    final_norm: int
    mtp_extra: int  # enorm + hnorm + eh_proj + shared-head norm
    kv_proj: int = 0  # GQA: the k and v projections (+ biases), part of attn_sharded
    position_embedding: int = 0  # learned position table P*H (GPT-2 wpe; replicated, first stage)
    mamba: int = 0  # a hybrid model's Mamba-2 mixer (TP-sharded)
    latent_proj: int = 0  # LatentMoE's two projections H -> L -> H (replicated over TP)
    gdn: int = 0  # a gated DeltaNet (TP-sharded but its norm's dv gains, ``gdn_replicated``)
    gdn_replicated: int = 0

    @property
    def attention(self) -> int:
        return self.attn_sharded + self.attn_replicated

    def mixer(self, kind: str) -> int:
        """The parameters of a layer's mixer: attention, a Mamba-2 mixer, a gated DeltaNet, or none
        (an MoE / MLP block)."""
        return {"attention": self.attention, "mamba": self.mamba, "gdn": self.gdn}.get(kind, 0)

    def ffn_active(self, cfg: ModelConfig, ffn: str) -> int:
        """The FFN weights one token uses: the dense MLP, the top-k routed and shared experts and the
        router, or none (a hybrid model's Mamba / attention block)."""
        if ffn == "dense":
            return self.dense_ffn
        if ffn == "none":
            return 0
        return cfg.num_experts_per_tok * self.expert + self.shared_expert + self.router + self.latent_proj

    @property
    def moe_block(self) -> int:
        return self.routed_experts + self.shared_expert + self.router + self.latent_proj


def _gqa_attention(cfg: ModelConfig) -> tuple[int, int]:
    """(TP-sharded, replicated) parameters of one GQA / MHA attention block (GPT-OSS's attention
    sinks, one per head, and OLMo's norms over the whole q and k projections are sharded with their
    heads; a QK-norm of ``head_dim`` is replicated; Qwen3-Next's output gate doubles ``q_proj``'s
    columns, and its bias with them)."""
    H, h, d, g = cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim, cfg.num_key_value_heads
    gate = h * d * (H + (1 if cfg.qkv_bias else 0)) if cfg.attention_output_gate else 0
    sharded = (gate + H * h * d + 2 * H * g * d + h * d * H + ((h * d + 2 * g * d) if cfg.qkv_bias else 0)
               + (h if cfg.attention_sinks else 0) + ((h + g) * d if cfg.qk_norm_full else 0))
    replicated = (H if cfg.o_bias else 0) + (2 * d if cfg.qk_norm else 0)
    return sharded, replicated


def shapes(cfg: ModelConfig) -> Shapes:
    """Per-module parameter counts (module docstring) of ``cfg``."""
    H, h = cfg.hidden_size, cfg.num_attention_heads
    rq, rkv = cfg.q_lora_rank, cfg.kv_lora_rank
    dn, dr, dv = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
    if rq:
        q_rep, q_sh = H * rq + rq, rq * h * (dn + dr)
    else:
        q_rep, q_sh = 0, H * h * (dn + dr)
    kv_rep, kv_sh = H * (rkv + dr) + rkv, rkv * h * (dn + dv)
    o_sh = h * dv * H
    attn_sh, attn_rep = q_sh + kv_sh + o_sh, q_rep + kv_rep
    if cfg.attention == "gqa":
        attn_sh, attn_rep = _gqa_attention(cfg)
    idx_in = rq if rq else H
    indexer = (idx_in * cfg.index_n_heads * cfg.index_head_dim + H * cfg.index_head_dim
               + H * cfg.index_n_heads + 2 * cfg.index_head_dim) if cfg.has_indexer else 0
    f = 3 if cfg.gated_mlp else 2
    d_in = cfg.moe_latent_size or H  # the routed experts' model dimension (LatentMoE: the latent)
    expert = f * d_in * cfg.moe_intermediate_size + ((2 * cfg.moe_intermediate_size + H) if cfg.expert_bias else 0)
    E = cfg.n_routed_experts
    return Shapes(
        attn_sharded=attn_sh,
        attn_replicated=attn_rep,
        norms=cfg.norms_per_layer * (2 if cfg.norm_bias else 1) * H,
        indexer=indexer,
        dense_ffn=(3 if cfg.gated_mlp else 2) * H * cfg.intermediate_size
        + (((2 if cfg.gated_mlp else 1) * cfg.intermediate_size + H) if cfg.mlp_bias else 0),
        expert=expert,
        routed_experts=E * expert,
        shared_expert=cfg.n_shared_experts * f * H * cfg.moe_intermediate_size,
        router=E * H + (E if cfg.router_weight_bias else 0) + (H if cfg.shared_expert_gate else 0),
        router_bias=E if cfg.moe_router_bias else 0,
        embedding=cfg.vocab_size * H,
        lm_head=0 if cfg.tie_word_embeddings else cfg.vocab_size * H,
        final_norm=(2 if cfg.norm_bias else 1) * H,
        mtp_extra=2 * H + 2 * H * H + H + (H if cfg.layer_mixers is not None else 0),  # hybrid: the MoE block's norm
        kv_proj=(2 * H * cfg.num_key_value_heads * cfg.head_dim
                 + (2 * cfg.num_key_value_heads * cfg.head_dim if cfg.qkv_bias else 0)) if cfg.attention == "gqa" else 0,
        position_embedding=cfg.position_embeddings * H,
        mamba=cfg.mamba.params(H) if cfg.mamba else 0,
        gdn=cfg.gdn.params(H) if cfg.gdn else 0,
        gdn_replicated=cfg.gdn.value_head_dim if cfg.gdn else 0,
        latent_proj=2 * H * cfg.moe_latent_size + ((cfg.moe_latent_size + H) if cfg.mlp_bias else 0)
        if cfg.moe_latent_size and E else 0,
    )


def layer_components(cfg: ModelConfig, roles: RoleMap, layer: int, sh: Shapes | None = None) -> dict[str, int]:
    """Components of decoder layer ``layer`` (1-based); MTP layers are numbered after the decoder."""
    sh = sh or shapes(cfg)
    if layer > cfg.num_hidden_layers:
        return {"mtp": mtp_layer_total(cfg, sh, with_bias=False)}
    r = roles.role(layer)
    out = {k: 0 for k in COMPONENTS}
    out["attention"] = sh.mixer("attention") if r.mixer == "attention" else 0
    out["mamba"] = sh.mixer("mamba") if r.mixer == "mamba" else 0
    out["gdn"] = sh.mixer("gdn") if r.mixer == "gdn" else 0
    out["norms"] = sh.norms
    out["indexer"] = sh.indexer if r.has_indexer else 0
    if r.ffn == "dense":
        out["dense_ffn"] = sh.dense_ffn
    elif r.ffn == "moe":
        out["routed_experts"] = sh.routed_experts
        out["shared_expert"] = sh.shared_expert
        out["router"] = sh.router
        out["latent_proj"] = sh.latent_proj
        out["router_bias"] = sh.router_bias
    return out


def mtp_layer_total(cfg: ModelConfig, sh: Shapes, *, with_bias: bool) -> int:
    moe = sh.moe_block + (sh.router_bias if with_bias else 0) if cfg.n_routed_experts else sh.dense_ffn
    return sh.attention + sh.norms + sh.indexer + moe + sh.mtp_extra


def _layer_total(c: dict[str, int], *, with_bias: bool) -> int:
    return sum(v for k, v in c.items() if with_bias or k != "router_bias")


@dataclass(frozen=True)
class ParamReport:
    main_total: int
    checkpoint_total: int
    active: int
    indexer_layers: int
    breakdown: dict[str, int]
    per_layer: list[dict[str, Any]]

    def to_json(self) -> dict[str, Any]:
        return {
            "main_total": self.main_total,
            "checkpoint_total": self.checkpoint_total,
            "active": self.active,
            "indexer_layers": self.indexer_layers,
            "breakdown": self.breakdown,
            "per_layer": self.per_layer,
        }


def count_parameters(cfg: ModelConfig, roles: RoleMap | None = None) -> ParamReport:
    roles = roles or derive_roles(cfg)
    sh = shapes(cfg)
    breakdown = {k: 0 for k in COMPONENTS}
    per_layer = []
    for n in range(1, cfg.num_hidden_layers + 1):
        c = layer_components(cfg, roles, n, sh)
        for k, v in c.items():
            breakdown[k] += v
        r = roles.role(n)
        per_layer.append({"layer": n, "role": r.role, "ffn": r.ffn, "mixer": r.mixer,
                          "total": _layer_total(c, with_bias=False), **c})
    breakdown["embedding"] = sh.embedding + sh.position_embedding
    breakdown["lm_head"] = sh.lm_head
    breakdown["final_norm"] = sh.final_norm
    n_mtp = cfg.num_nextn_predict_layers
    own_copies = sh.embedding + (sh.lm_head or sh.embedding) if cfg.mtp_stores_embedding_and_head else 0
    breakdown["mtp"] = n_mtp * (mtp_layer_total(cfg, sh, with_bias=True) + own_copies)
    main_total = sum(v for k, v in breakdown.items() if k not in ("router_bias", "mtp"))
    checkpoint_total = main_total + breakdown["router_bias"] + breakdown["mtp"]
    n_idx = sum(1 for r in roles.layers if r.has_indexer)
    active = (
        sum(sh.mixer(r.mixer) + sh.norms + sh.ffn_active(cfg, r.ffn) for r in roles.layers)
        + n_idx * sh.indexer
        + sh.final_norm
        + (sh.lm_head or sh.embedding)
    )
    return ParamReport(main_total, checkpoint_total, active, n_idx, breakdown, per_layer)


# --------------------------------------------------------------------------- per stage / per GPU


@dataclass(frozen=True)
class StageParams:
    """Parameters one pipeline stage holds: ``dense`` (replicated over EP, sharded by TP) and
    ``expert`` (routed experts, sharded by EP x ETP), as totals and per GPU."""

    components: dict[str, int]
    dense_total: int
    expert_total: int
    dense_per_gpu: int
    expert_per_gpu: int

    @property
    def total(self) -> int:
        return self.dense_total + self.expert_total

    @property
    def per_gpu(self) -> int:
        return self.dense_per_gpu + self.expert_per_gpu


def serving_expert_tp(tp: int, ep: int) -> int:
    """How many ways a serving engine splits each routed expert: TP without expert parallelism,
    else ``tp // ep`` (at least 1) - SGLang's ``moe_tp_size = tp_size // moe_ep_size``
    (``python/sglang/srt/distributed/parallel_state.py``); vLLM's expert parallelism (EP = TP x DP)
    holds whole experts."""
    return max(1, tp // ep)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass
class _Tally:
    """Running counts of :func:`stage_params`: the parameters by component, and by how a GPU holds
    them (TP-sharded, replicated, routed experts, GQA k/v projections held whole per query group)."""

    cfg: ModelConfig
    sh: Shapes
    tp: int
    comp: dict[str, int] = field(default_factory=lambda: {k: 0 for k in COMPONENTS})
    sharded: int = 0
    replicated: int = 0
    expert: int = 0
    kv_total: int = 0
    kv_gpu: int = 0

    @property
    def kv_whole(self) -> bool:
        """GQA with TP above the key-value heads g (Megatron accepts TP a multiple of g,
        ``transformer_config.py``: "num_query_groups ... must be a multiple or divisor of
        tensor_model_parallel_size") keeps one whole query group's k and v projections on each GPU:
        ``kv_proj / g`` per layer instead of ``kv_proj / TP``."""
        return self.cfg.attention == "gqa" and self.tp > self.cfg.num_key_value_heads

    def add_attention(self, n: int = 1) -> None:
        """``n`` attention blocks: the up / output projections TP-sharded (the k / v projections whole
        per query group under :attr:`kv_whole`), the down-projections and their norms replicated."""
        self.sharded += n * (self.sh.attn_sharded - (self.sh.kv_proj if self.kv_whole else 0))
        self.replicated += n * self.sh.attn_replicated
        if self.kv_whole:
            self.kv_total += n * self.sh.kv_proj
            self.kv_gpu += n * (self.sh.kv_proj // self.cfg.num_key_value_heads)

    def add_decoder_layer(self, has_indexer: bool, ffn: str, n: int = 1, mixer: str = "attention") -> None:
        """``n`` decoder layers of one kind: the mixer (attention, a hybrid model's Mamba mixer or a
        gated DeltaNet, TP-sharded) and norms, the indexer (replicated) where it owns one, and a dense FFN
        (TP-sharded) or an MoE block (routed experts, TP-sharded shared expert, replicated router)."""
        sh, comp = self.sh, self.comp
        if mixer == "attention":
            comp["attention"] += n * sh.attention
            self.add_attention(n)
        elif mixer == "mamba":
            comp["mamba"] += n * sh.mamba
            self.sharded += n * sh.mamba
        elif mixer == "gdn":
            comp["gdn"] += n * sh.gdn
            self.sharded += n * (sh.gdn - sh.gdn_replicated)
            self.replicated += n * sh.gdn_replicated
        comp["norms"] += n * sh.norms
        self.replicated += n * sh.norms
        if has_indexer:
            comp["indexer"] += n * sh.indexer
            self.replicated += n * sh.indexer
        if ffn == "dense":
            comp["dense_ffn"] += n * sh.dense_ffn
            self.sharded += n * sh.dense_ffn
            return
        if ffn == "none":
            return
        comp["routed_experts"] += n * sh.routed_experts
        comp["shared_expert"] += n * sh.shared_expert
        comp["router"] += n * sh.router
        comp["latent_proj"] += n * sh.latent_proj
        self.expert += n * sh.routed_experts
        self.sharded += n * sh.shared_expert
        self.replicated += n * (sh.router + sh.latent_proj)

    def add_ends(self, stage: Stage) -> None:
        """The embedding (vocab-parallel; learned positions replicated) on the first stage and on
        the MTP stage, which shares it; the lm_head (vocab-parallel) and final norm on the loss stage."""
        sh, comp = self.sh, self.comp
        if stage.embedding or stage.mtp_layers > 0:
            comp["embedding"] += sh.embedding + sh.position_embedding
            self.sharded += sh.embedding
            self.replicated += sh.position_embedding
        if stage.loss:
            comp["lm_head"] += sh.lm_head
            comp["final_norm"] += sh.final_norm
            self.sharded += sh.lm_head
            self.replicated += sh.final_norm

    def add_mtp_layer(self) -> None:
        """An MTP layer: attention (split as above), norms, indexer, MoE (a dense FFN in a model
        without routed experts); eh_proj (2H^2) is column-parallel, enorm / hnorm / shared-head
        norm (3H; a hybrid model's MoE block's norm too) are replicated."""
        cfg, sh = self.cfg, self.sh
        eh_proj = 2 * cfg.hidden_size * cfg.hidden_size
        self.comp["mtp"] += mtp_layer_total(cfg, sh, with_bias=False)
        self.add_attention()
        self.sharded += sh.shared_expert + eh_proj
        self.replicated += sh.norms + sh.indexer + sh.router + sh.latent_proj + sh.mtp_extra - eh_proj
        self.expert += sh.routed_experts
        if not cfg.n_routed_experts:
            self.sharded += sh.dense_ffn


def _expert_per_gpu(cfg: ModelConfig, expert: int, ep: int, etp: int) -> int:
    """Routed-expert parameters on one GPU: ``ceil(E / EP)`` whole experts, each split over ETP."""
    if not cfg.n_routed_experts:
        return 0
    per_expert_total = expert // cfg.n_routed_experts  # all experts' weights of these layers / E
    return _ceil_div(per_expert_total * _ceil_div(cfg.n_routed_experts, ep), etp)


#: :func:`stage_params` by everything it reads (a drag leaves most stages as they were); bounded
_STAGE_PARAMS: dict[tuple[Any, ...], StageParams] = {}
STAGE_PARAMS_SIZE = 4096


def stage_params(cfg: ModelConfig, roles: RoleMap, stages: list[Stage], *, tp: int = 1, ep: int = 1,
                 etp: int | None = None) -> StageParams:
    """Parameters of a set of stages (e.g. all virtual stages of one pipeline rank): every decoder
    layer, the embedding / head ends and every MTP layer (:class:`_Tally`); per GPU the sharded
    part over TP, the replicated part whole, routed experts over EP x ETP. Kept by what it reads:
    the config, TP / EP / ETP, each stage's ends and MTP layers, and its layers' indexer and FFN kind."""
    key = (cfg, tp, ep, etp, tuple((s.embedding, s.loss, s.mtp_layers) for s in stages),
           tuple((r.has_indexer, r.ffn, r.mixer) for s in stages for r in roles.of(s.layers)))
    found = _STAGE_PARAMS.get(key)
    if found is None:
        found = remember(_STAGE_PARAMS, key, _stage_params(cfg, roles, stages, tp, ep, etp), STAGE_PARAMS_SIZE)
    return found


def _stage_params(cfg: ModelConfig, roles: RoleMap, stages: list[Stage], tp: int, ep: int,
                  etp: int | None) -> StageParams:
    t = _Tally(cfg, shapes(cfg), tp)
    for s in stages:
        held = Counter((r.has_indexer, r.ffn, r.mixer) for r in roles.of(s.layers))
        for (has_indexer, ffn, mixer), n in held.items():
            t.add_decoder_layer(has_indexer, ffn, n, mixer)
        t.add_ends(s)
        for _ in range(s.mtp_layers):
            t.add_mtp_layer()
    return StageParams(
        components=t.comp,
        dense_total=t.sharded + t.replicated + t.kv_total,
        expert_total=t.expert,
        dense_per_gpu=_ceil_div(t.sharded, tp) + t.replicated + t.kv_gpu,
        expert_per_gpu=_expert_per_gpu(cfg, t.expert, ep, tp if etp is None else etp),
    )


def per_rank_params(cfg: ModelConfig, roles: RoleMap, plan: StagePlan, *, tp: int = 1, ep: int = 1,
                    etp: int | None = None) -> list[StageParams]:
    """One :class:`StageParams` per pipeline rank (all its virtual stages together)."""
    return [stage_params(cfg, roles, plan.rank_stages(r), tp=tp, ep=ep, etp=etp) for r in range(plan.pp)]
