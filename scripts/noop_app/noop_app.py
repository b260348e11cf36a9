"""A no-op Flower app: the per-round floor of a deployment, for comparison with FairVFL.

Each round the ServerApp pushes one empty message to every node and polls for the
replies every 10 ms (as FairVFL's strategy does); the ClientApp imports only flwr and
replies at once. The ServerApp writes per-round seconds as JSON to run config `output`.
With run config `payload-floats = n` > 0 every message carries n float32 each way (the
size of FairVFL's z/ν and partial logits), for bench/overhead.py.
"""

import atexit
import json
import os
import time

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

client = ClientApp()
server = ServerApp()


@client.query()
def noop(message: Message, context: Context) -> Message:
    if os.environ.get("FAIRVFL_TIMING_LOG"):  # the floor's CPU per ClientApp process, as FairVFL's timing log
        _log_cpu(os.environ["FAIRVFL_TIMING_LOG"], time.process_time())
    return Message(_payload(int(context.run_config.get("payload-floats", 0))), reply_to=message)


def _log_cpu(folder: str, at_handler: float) -> None:
    def write() -> None:
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"noop-clientapp-{os.getpid()}.jsonl"), "a") as fh:
            fh.write(json.dumps({"event": "exit", "cpu_handler_start": at_handler, "cpu": time.process_time()}) + "\n")

    atexit.register(write)


def _payload(n: int) -> RecordDict:
    return RecordDict({"p": ArrayRecord({"x": Array(np.zeros(n, dtype=np.float32))})}) if n > 0 else RecordDict()


@server.main()
def main(grid: Grid, context: Context) -> None:
    rounds = int(context.run_config["num-server-rounds"])
    nodes = list(grid.get_node_ids())
    deadline = time.monotonic() + 120  # simulation registers its nodes after the run starts
    while len(nodes) < int(context.run_config.get("min-nodes", 0)) and time.monotonic() < deadline:
        time.sleep(0.2)
        nodes = list(grid.get_node_ids())
    seconds = []
    for t in range(rounds + 1):  # round 0 includes the first FAB install; reported separately
        start = time.perf_counter()
        payload = int(context.run_config.get("payload-floats", 0))
        ids = set(grid.push_messages([Message(_payload(payload), dst_node_id=n, message_type="query", group_id=str(t)) for n in nodes]))
        while ids:
            got = list(grid.pull_messages(list(ids)))
            for reply in got:
                ids.discard(reply.metadata.reply_to_message_id)
            if ids and not got:
                time.sleep(0.01)
        seconds.append(time.perf_counter() - start)
    if context.run_config.get("output"):
        with open(str(context.run_config["output"]), "w") as fh:
            json.dump({"nodes": len(nodes), "seconds": seconds}, fh)
