#!/usr/bin/env python3
"""A bursty request trace in Mooncake's JSON Lines format, for `tandem bench --dataset` and
`tandem plan --dataset` (bench/serving/validate_planner.py's "trace" workload).

Arrivals are not Poisson: 70% of the gaps are short (exponential, mean 50 ms) and 30% long
(mean 600 ms), so requests come in bursts (~4.6 requests/s on average as recorded; replays
scale it). Prompt lengths are log-uniform in [128, 1024] tokens, outputs uniform in [32, 256].
No hash_ids: the prompts share no prefix (the planner does not model prefix-cache hits).
Deterministic for a seed.

  /usr/bin/python3 bench/serving/make_bursty_trace.py --requests 120 --seed 7 \\
      > bench/traces/bursty-120.jsonl
"""
import argparse
import json
import math
import random

p = argparse.ArgumentParser()
p.add_argument("--requests", type=int, default=120)
p.add_argument("--seed", type=int, default=7)
args = p.parse_args()
rng = random.Random(args.seed)
t = 0.0
for i in range(args.requests):
    if i > 0:
        t += rng.expovariate(1 / 0.05) if rng.random() < 0.7 else rng.expovariate(1 / 0.6)
    prompt = int(round(math.exp(rng.uniform(math.log(128), math.log(1024)))))
    output = rng.randint(32, 256)
    print(json.dumps({"timestamp": round(t * 1000, 1), "input_length": prompt,
                      "output_length": output}))
