"""`gpuledger node`: the GPU inventory of a running server (which node each GPU is registered to, the rows held
because a node sent a GPU not its own) and an admin's move of a GPU to another node, through the server's API.

Through the server only: the inventory is the ingest writer's (analytics/store/gpu_inventory.py), and a move stores
the held rows under the same rules as a push, in the writer's own commits.
"""
from __future__ import annotations

import argparse
import json
from typing import Any

from gpuledger.collector.errors import InputError
from gpuledger.deploy.cli_options import add_server
from gpuledger.deploy.token_admin import RemoteAdmin


def add_parser(sub: Any) -> None:
    """The `node` command's arguments."""
    node = sub.add_parser("node", help="the GPU inventory: which node each GPU is registered to, held rows, moves",
                          description="A node bills only the GPUs registered to it (its first reports register them); "
                                      "rows it sends of another GPU are held. `list` shows both; `assign GPU --to "
                                      "NODE` registers a GPU to a node (a GPU that really moved) and bills that "
                                      "node's held rows of it. Through a running --server: `list` with any token "
                                      "that reads, `assign` with an admin token.")
    add_server(node, "the running gpuledger server", "a token (an admin's for assign); default $GPULEDGER_TOKEN",
               required=True)
    node.add_argument("action", choices=["list", "assign"],
                      help="list the nodes and the GPUs each may report, or assign a GPU to a node")
    node.add_argument("gpu", nargs="?", help="assign: the GPU's UUID (as `node list` shows it)")
    node.add_argument("--to", metavar="NODE", help="assign: the node to register it to")
    node.add_argument("--model", help="assign: its model (default: as registered, else as its held rows say)")
    node.add_argument("--json", action="store_true", help="print the server's answer as JSON")


def cmd_node(args: argparse.Namespace, config: Any) -> int:
    if not args.token:
        raise InputError("gpuledger node needs a --token (or $GPULEDGER_TOKEN): an admin's to assign")
    server = RemoteAdmin(args.server, args.token, str(args.ca) if args.ca else None)
    if args.action == "assign" and not (args.gpu and args.to):
        raise InputError("node assign needs the GPU's UUID and --to NODE")
    if args.action == "list":
        answer = server.call("GET", "/v1/nodes/inventory")
        if args.json:
            print(json.dumps(answer, indent=2))
            return 0
        print(f"{'NODE':<30} {'GPU':<44} {'MODEL':<12} REGISTERED BY")
        for gpu in answer["gpus"]:
            print(f"{gpu['node']:<30} {gpu['gpu_uuid']:<44} {gpu['gpu_model'] or '?':<12} {gpu['registered_by']}")
        for held in answer["held"]:
            print(f"HELD {held['rows']} row(s) of {held['gpu_uuid']} sent by {held['node']}: {held['reason']}"
                  f" (registered to {held['registered_to'] or 'no node'})")
        return 0
    body = {"gpu_uuid": args.gpu, **({"gpu_model": args.model} if args.model else {})}
    answer = server.call("POST", f"/v1/nodes/{args.to}/gpus", json=body)
    if args.json:
        print(json.dumps(answer, indent=2))
    else:
        print(f"{answer['gpu_uuid']} registered to {answer['node']} (was {answer['previous_node'] or 'nowhere'}): "
              f"{answer['released_rows']} held row(s) billed, refused {answer['refused_rows'] or 'none'}, "
              f"{answer['still_held_rows']} still held (of another model than {answer['gpu_model'] or 'unknown'}: "
              f"give --model to bill them)")
    return 0
