# SPDX-License-Identifier: Apache-2.0
"""One vLLM engine in its own process, driven by JSON lines on stdin (used by the vLLM end-to-end tests).

Usage: ``python engine_proc.py MODEL_DIR CONFIG_JSON``. CONFIG_JSON holds ``kv_transfer`` (a
``KVTransferConfig`` as a dict, or null for a plain engine) and optionally ``block_size`` (default 32),
``tp`` (tensor_parallel_size, default 1) and ``one_process`` (default true: with TP 1, the engine core and
its worker run in this process).
Commands, one JSON object per line:

* ``{"op": "generate", "prompts": [[ids...], ...], "max_tokens": n, "params": [dict|null, ...]}``
  answers ``{"tokens": [[ids...], ...], "kv_transfer_params": [...], "seconds": s}``;
* ``{"op": "metrics", "prefix": "vllm:kvblocks"}`` answers ``{"lines": [...]}``: the lines of the
  Prometheus exposition (what vLLM's ``/metrics`` serves) starting with ``prefix`` (needs
  ``"log_stats": true`` in CONFIG_JSON);
* ``{"op": "quit"}`` exits.

The first line written is ``{"ready": true}`` once the engine is up. Anything else vLLM prints goes to
stderr, so stdout carries only answers.
"""
import json
import os
import sys
import time


def make_model(path: str) -> None:
    """Write a tiny random Llama checkpoint (safetensors, < 1 MB) whose KV really matters."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=32, num_hidden_layers=2, vocab_size=512, max_position_embeddings=1024,
                      initializer_range=0.5, tie_word_embeddings=False, torch_dtype="bfloat16")
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(path, safe_serialization=True)
    write_tokenizer(path, cfg.vocab_size)


def write_tokenizer(path: str, vocab_size: int) -> None:
    """A small byte-level BPE tokenizer (trained here, no download), so text prompts work too."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - 2, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    corpus = ["Hello world, the KV cache moves between prefill and decode.", "kvblocks pulls blocks."] * 50
    tok.train_from_iterator(corpus, trainer)
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>").save_pretrained(path)


def main() -> None:
    model_dir, cfg_json = sys.argv[1], sys.argv[2]
    cfg = json.loads(cfg_json)
    real_stdout = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # vLLM's prints go to stderr
    one_process = cfg.get("tp", 1) == 1 and cfg.get("one_process", True)
    if one_process:
        # One process instead of three (engine core and worker in this one, with the uni executor below):
        # each vLLM process start imports torch and vLLM again (28-46 CPU s an engine with three, about 10
        # with one, measured here). Set before vLLM reads its environment.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig

    kw = {}
    if cfg.get("tp", 1) > 1:
        kw["tensor_parallel_size"] = cfg["tp"]
    if one_process:
        kw["distributed_executor_backend"] = "uni"
    if cfg.get("log_stats"):
        kw["disable_log_stats"] = False
    if cfg.get("kv_transfer"):
        kw["kv_transfer_config"] = KVTransferConfig(**cfg["kv_transfer"])
    llm = LLM(model=model_dir, skip_tokenizer_init=True, block_size=cfg.get("block_size", 32), enforce_eager=True,
              kv_cache_memory_bytes=64 << 20, max_model_len=1024, max_num_seqs=8, seed=0,
              enable_prefix_caching=cfg.get("prefix_caching", False), **kw)
    real_stdout.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "quit":
            break
        if cmd["op"] == "metrics":
            from prometheus_client import REGISTRY, generate_latest
            lines = [x for x in generate_latest(REGISTRY).decode().splitlines() if x.startswith(cmd["prefix"])]
            real_stdout.write(json.dumps({"lines": lines}) + "\n")
            continue
        prompts = [{"prompt_token_ids": p} for p in cmd["prompts"]]
        params = cmd.get("params") or [None] * len(prompts)
        sps = [SamplingParams(temperature=0.0, max_tokens=cmd["max_tokens"], ignore_eos=True,
                              detokenize=False, extra_args={"kv_transfer_params": p} if p else None)
               for p in params]
        t0 = time.perf_counter()
        outs = llm.generate(prompts, sps, use_tqdm=False)
        took = time.perf_counter() - t0
        real_stdout.write(json.dumps({
            "tokens": [list(o.outputs[0].token_ids) for o in outs],
            "kv_transfer_params": [o.kv_transfer_params for o in outs],
            "seconds": took,
        }) + "\n")


if __name__ == "__main__":
    if sys.argv[1] == "--make-model":
        make_model(sys.argv[2])
    else:
        main()
