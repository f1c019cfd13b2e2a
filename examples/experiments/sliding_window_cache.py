"""Decode-step cost of a sliding-window target: transformers' sliding cache vs a cache that keeps
the full past (what the engine uses), on Gemma 3 270M's shapes with random weights."""
import statistics, time, torch
from transformers import AutoModelForCausalLM, DynamicCache, Gemma3TextConfig
torch.manual_seed(0)
cfg = Gemma3TextConfig(vocab_size=262144, hidden_size=640, intermediate_size=2048, num_hidden_layers=18,
                       num_attention_heads=4, num_key_value_heads=1, head_dim=256, sliding_window=512,
                       max_position_embeddings=32768)
m = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
print(sorted(set(cfg.layer_types)), flush=True)
def step_times(cache_factory, ctx, steps=12):
    cache = cache_factory()
    ids = torch.randint(0, 1000, (1, ctx))
    with torch.inference_mode():
        m(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        ts = []
        for i in range(steps):
            t = time.perf_counter()
            m(input_ids=torch.tensor([[5]]), past_key_values=cache, use_cache=True,
              position_ids=torch.tensor([[ctx + i]]), logits_to_keep=1)
            ts.append(time.perf_counter() - t)
    return statistics.median(ts[2:]), sum(l.keys.numel() * 2 * 4 for l in cache.layers) / 2**20
for ctx in (1024, 4096, 8192):
    for _ in range(2):
        s, smb = step_times(lambda: DynamicCache(config=cfg), ctx)
        f, fmb = step_times(DynamicCache, ctx)
    print(f"ctx {ctx}: sliding cache {s*1e3:.1f} ms/step ({smb:.0f} MiB KV), full past {f*1e3:.1f} ms/step ({fmb:.0f} MiB KV), ratio {f/s:.3f}", flush=True)
