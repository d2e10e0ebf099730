"""Run one SGLang engine configuration in its own process and dump results as JSON.

Usage: python tests/engine_job.py JOB.json OUT.json
JOB = {"engine": {...sgl.Engine kwargs...}, "env": {...}, "batches": [
          {"prompts": [...], "sampling": {...} or [...], "n": 1}], "server_info": bool}
Each batch is one ``generate`` call (all prompts concurrently).
"""

import json
import os
import sys


def main():
    job = json.load(open(sys.argv[1]))
    os.environ.update({k: str(v) for k, v in job.get("env", {}).items()})
    os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
    import sglang as sgl

    engine = sgl.Engine(**job["engine"])
    results = []
    try:
        for batch in job["batches"]:
            prompts = batch["prompts"] * int(batch.get("n", 1))
            sampling = batch["sampling"]
            if isinstance(sampling, list):
                sampling = sampling * int(batch.get("n", 1))
            outs = engine.generate(prompts, sampling)
            results.append([{"text": o["text"], "output_ids": o.get("output_ids"),
                             "meta_info": {k: v for k, v in o["meta_info"].items()
                                           if isinstance(v, (int, float, str, type(None)))}}
                            for o in outs])
        info = engine.get_server_info() if job.get("server_info") else None
    finally:
        engine.shutdown()
    json.dump({"results": results, "server_info": info}, open(sys.argv[2], "w"), default=str)


if __name__ == "__main__":
    main()
