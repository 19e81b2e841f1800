"""Small builders shared by tests."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import torch

ONE_UPDATE = {
    "epochs": 1, "updates_per_epoch": 1, "games_per_update": 2, "group_size": 2, "validation_games": 1,
    "analyzer_max_new_tokens": 16, "learning_rate": 0.01,
}  # fmt: skip
"""`rl` settings of a run of one update over 2 games x 2 episodes, with a learning rate that visibly moves a tiny
model."""

PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")


def tiny_policy(tokenizer_dir: Path, seed: int = 0, batch_size: int = 4):
    """An HFPolicy over a tiny random-init llama with the real SmolLM2 tokenizer (no downloads)."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from seed_core.policy.hf import HFPolicy

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=1,  # head_dim 32: the smallest vLLM's CPU attention runs (the pipeline tests sample with it)
        num_key_value_heads=1,
        max_position_embeddings=4096,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(cfg).eval()
    return HFPolicy(model, tok, batch_size=batch_size)


def chat_reply(content: str, prompt_tokens: int = 11, completion_tokens: int = 7) -> dict:
    """A chat-completions response body with one assistant message."""
    return {
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}}],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def reply(h: BaseHTTPRequestHandler, status: int, body: bytes | dict, headers: dict[str, str] | None = None) -> None:
    """Writes one JSON response; a client that has already hung up (a timeout the test provoked) is ignored."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    try:
        h.send_response(status)
        for k, v in {"Content-Type": "application/json", "Content-Length": str(len(data)), **(headers or {})}.items():
            h.send_header(k, v)
        h.end_headers()
        h.wfile.write(data)
    except (BrokenPipeError, ConnectionResetError):
        pass


@contextmanager
def chat_endpoint(handle: Callable[[BaseHTTPRequestHandler, dict], None]) -> Iterator[str]:
    """A real HTTP server on 127.0.0.1 (an ephemeral port) answering each POST from a thread with
    `handle(request handler, parsed JSON body)`; yields its base URL (`.../v1`)."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            handle(self, json.loads(self.rfile.read(int(self.headers["Content-Length"]))))

        def log_message(self, *args):
            pass  # keep pytest's output clean

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


QWEN_VISION_TOKENS = ("<|vision_start|>", "<|image_pad|>", "<|vision_end|>")


def tiny_qwen_vl(tokenizer_dir: Path, out_dir: Path, seed: int = 0) -> Path:
    """A tiny random-init Qwen2.5-VL (the paper's visual architecture) with the SmolLM2 tokenizer plus Qwen's three
    vision tokens, saved as a safetensors HF folder."""
    from transformers import AutoTokenizer, Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    tok.add_special_tokens({"additional_special_tokens": list(QWEN_VISION_TOKENS)})
    start, pad, end = tok.convert_tokens_to_ids(list(QWEN_VISION_TOKENS))
    torch.manual_seed(seed)
    cfg = Qwen2_5_VLConfig(
        text_config={
            "vocab_size": len(tok),
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "max_position_embeddings": 4096,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
            "bos_token_id": tok.bos_token_id,
            "eos_token_id": tok.eos_token_id,
            "pad_token_id": tok.pad_token_id,
            "tie_word_embeddings": True,
        },
        vision_config={
            "depth": 1,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_heads": 2,
            "out_hidden_size": 32,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "window_size": 56,
            "fullatt_block_indexes": [0],
        },
        vision_start_token_id=start,
        image_token_id=pad,
        vision_end_token_id=end,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=True,
    )
    model = Qwen2_5_VLForConditionalGeneration(cfg).eval()
    model.save_pretrained(out_dir, safe_serialization=True)
    tok.save_pretrained(out_dir)
    return Path(out_dir)


def read_stage_metrics(path: Path) -> dict:
    """A stage's metrics file merged with its timings (the same name under time/ beside it): what the stage
    returned. Checks first that the results file holds no time/ or memory/ key."""
    results = json.loads(path.read_text())
    timing = json.loads((path.parent / "time" / path.name).read_text())
    assert not [k for k in results if "time/" in k or "memory/" in k], results
    return {**results, **timing}
