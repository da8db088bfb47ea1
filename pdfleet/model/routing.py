"""The per-request decider's settings: one definition for the profile's `gateway.decider` and the gateway
policy's `decider:` (rendered from it), like stages.py for the rollout stages.

What they mean (issue 32; the decision itself is pdfleet.gateway.decider):
- `threshold_on`: `prompt` classes a request by its whole estimated prompt (the routing before the
  decider); `effective` by the tokens the chosen colocated instance would still have to prefill (its
  prompt minus the prefix the gateway estimates that instance has cached), as llm-d's
  prefix-based-pd-decider and Dynamo's conditional disaggregation do.
- `colocated_choice`: `round_robin` (the routing before the decider) or `prefix_load`: the colocated
  instance with the least (outstanding prompt tokens to prefill + this request's uncached tokens x (1 +
  the streams it is decoding)), so a conversation keeps its cache, two long prefills do not stack on one
  instance while another idles, and a fresh prefill goes where fewer streams would stall behind it.
  Issue 26's bench compares the two: a request may ask for either in the `X-Pdfleet-Colocated-Choice`
  header (CHOICE_HEADER), honoured like the pool override header and only while the policy enables it.
  Likewise `X-Pdfleet-Threshold-On` (THRESHOLD_HEADER) asks for `prompt` or `effective` for one request,
  so a comparison of length-only routing against the decider runs on one gateway, one policy (issue 32's
  lab test): a request that asks for `effective` or `prefix_load` under a policy keeping no prefix index
  reads and feeds an index only such requests keep.
- `block_tokens`, `index_blocks`: the approximate prefix index's block (vLLM's default block size is 16
  tokens) and its bound per candidate, in blocks (least recently used blocks are forgotten first).
- `prefill_busy_waiting`: a request the stage sends to the P/D pool stays colocated (`prefill busy`)
  while a prefill instance has more than this many requests waiting (`vllm:num_requests_waiting`), or
  its figure is unknown (not scraped within `stale_s`: a stopped instance is never idle);
  `decode_busy_waiting` the same for the decode instances (`decode busy`). Unset: no bypass.
- `poll_s`: how often the gateway scrapes the P/D pool's instances (at most 1 s).
- `cache_source`: where the cached-prefix facts come from: `index` (the gateway's own approximate index of
  what it routed where, any vLLM) or `kv_events` (each colocated instance's KV-cache events: provision
  renders `--kv-events-config` into its unit with the publisher port from pdfleet/fleet/topology.py, and
  the gateway subscribes to every instance; exact for prompts given as token ids, 0 cached for text
  prompts, see pdfleet/gateway/kv_events.py). A profile's `models:` entry may set its own
  (`gateway.decider.cache_source`); the policy lists the events endpoints per alias (`kv_events:`).
- `tokenizer`: how the gateway counts and cuts a chat request: `estimate` (characters per token, the text's
  own blocks) or `staged`: the model's own tokenizer and chat template, from the staged revision's files
  (model.source at model.revision: the same manifest, checked by SHA-256, the engines load), copied to the
  gateway host; the policy names the directory per alias (`tokenizer:`) and the gateway renders and
  tokenizes each chat request in a worker thread, so a text prompt's blocks are the ids the engines'
  KV events carry (pdfleet/gateway/prompt_ids.py). A simulator host of that model installs the tokenizer
  too (pdfleet[tokenizer]), so it prefills the same ids. Per model like `cache_source`.
"""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator

ThresholdOn = Literal["prompt", "effective"]
CacheSourceName = Literal["index", "kv_events"]
TokenizerSource = Literal["estimate", "staged"]
ColocatedChoice = Literal["round_robin", "prefix_load"]
COLOCATED_CHOICES: tuple[ColocatedChoice, ...] = get_args(ColocatedChoice)
CHOICE_HEADER = "X-Pdfleet-Colocated-Choice"  # one request's colocated choice (a bench's comparison)
THRESHOLD_ONS: tuple[ThresholdOn, ...] = get_args(ThresholdOn)
THRESHOLD_HEADER = "X-Pdfleet-Threshold-On"  # one request's threshold_on (a bench's comparison)
VLLM_DEFAULT_BLOCK_TOKENS = 16
# the decider keys each served model sets for itself (ModelDecider): the top level's are the first model's
MODEL_DECIDER_KEYS = ("cache_source", "tokenizer")


class DeciderSpec(BaseModel):
    """How the gateway decides where each request goes (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    threshold_on: ThresholdOn = "prompt"
    colocated_choice: ColocatedChoice = "round_robin"
    block_tokens: int = Field(VLLM_DEFAULT_BLOCK_TOKENS, ge=1, le=1024)
    index_blocks: int = Field(65536, ge=16, le=16_777_216)
    prefill_busy_waiting: int | None = Field(None, ge=0)
    decode_busy_waiting: int | None = Field(None, ge=0)
    poll_s: float = Field(1.0, gt=0, le=1.0)
    stale_s: float = Field(2.0, gt=0, le=60)
    cache_source: CacheSourceName = "index"
    tokenizer: TokenizerSource = "estimate"

    @model_validator(mode="after")
    def _stale_after_a_poll(self) -> DeciderSpec:
        if self.stale_s <= self.poll_s:
            raise ValueError(
                f"stale_s ({self.stale_s:g}) must exceed poll_s ({self.poll_s:g}): "
                "every figure would be stale before the next scrape"
            )
        return self

    @property
    def uses_index(self) -> bool:
        """The gateway's own prefix index is kept only when something reads it and it is the source."""
        return self.reads_cache and self.cache_source == "index"

    @property
    def reads_cache(self) -> bool:
        """Something reads cached-prefix facts (whichever their source)."""
        return self.threshold_on == "effective" or self.colocated_choice == "prefix_load"

    @property
    def polls(self) -> bool:
        """The P/D pool's instances are scraped only when a bypass bound is set."""
        return self.prefill_busy_waiting is not None or self.decode_busy_waiting is not None


class ModelDecider(BaseModel):
    """A served model's own decider settings (`models[i].gateway.decider`): its cache-facts source and the
    tokenizer the gateway runs for it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cache_source: CacheSourceName = "index"
    tokenizer: TokenizerSource = "estimate"
