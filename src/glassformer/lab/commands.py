"""`glassformer lab`: serve the browser lab on loopback, or write it as one offline HTML file."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import webbrowser

import torch

from ..errors import UsageError
from ..threads import SERVING_THREADS
from .api import LabAPI


def add_lab_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", metavar="DIR", default=None,
                        help="trained model folder (default: $GLASSFORMER_MODEL, else runs/default, if it "
                             "exists; else a seeded untrained model, labelled as such)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind (default 127.0.0.1: this machine only; any other needs --expose)")
    parser.add_argument("--expose", action="store_true",
                        help="allow binding a non-loopback address: anyone who can reach it can use the lab")
    parser.add_argument("--allow-host", metavar="NAME", action="append", default=[],
                        help="with --expose: a host name browsers use to reach the lab (repeatable)")
    parser.add_argument("--port", type=int, default=8765, help="port (default 8765; 0 = any free port)")
    parser.add_argument("--no-browser", action="store_true", help="do not open a browser window")
    parser.add_argument("--export", metavar="FILE", default=None,
                        help="write one self-contained HTML file (works offline from file://) and exit")


def lab_command(args: argparse.Namespace) -> int:
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be in [0, 65535], got {args.port}")
    # Many small requests, one model behind a lock: intra-op threads only add synchronisation
    # (measured: a 9-unit sentence 11 ms with 1 thread, ~200 ms with 2 on a busy 2-core machine).
    torch.set_num_threads(SERVING_THREADS)
    api = LabAPI(model_dir=args.model)
    model = api.lab_model                             # load now: a bad --model fails before serving
    if args.export:
        from .export import write_export
        size = write_export(api, args.export)
        print(f"wrote {args.export} ({size / 1024:.0f} KiB): open it in a browser, no server needed")
        return 0
    from .server import is_loopback, make_server
    if args.allow_host and not args.expose:
        raise UsageError("--allow-host only applies with --expose (a loopback lab answers to loopback names)")
    try:
        server = make_server(api, args.host, args.port, quiet=False, expose=args.expose,
                             allow_hosts=tuple(args.allow_host))
    except OSError as error:
        raise UsageError(f"cannot listen on {args.host}:{args.port}: {error.strerror}") from None
    label = api.describe(model)["label"]["en"]
    # Ctrl-C from here on is a normal stop (exit 0). Before uvicorn has its own handlers it asks the server to stop
    # rather than raising KeyboardInterrupt, which Python drops when it lands in a callback (an import's lock
    # clean-up): the lab then served on, deaf to that Ctrl-C.
    own = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, server.stop_soon) if own else None
    try:
        print(f"glassformer lab: {server.url}  (model: {label})", flush=True)
        if not is_loopback(args.host):
            print(f"warning: the lab listens on {args.host}, not only on this machine: anyone who can reach "
                  f"{server.url} can read the model and run computations on it", file=sys.stderr, flush=True)
        print("press Ctrl+C to stop", file=sys.stderr, flush=True)
        if not args.no_browser:
            webbrowser.open(server.url)
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        if own:
            signal.signal(signal.SIGINT, previous)
        server.server_close()
    return 0
