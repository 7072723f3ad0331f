"""The environment ``mindguard hunt`` sets for the command it runs, and ``Guard`` reads (no MindSpore import)."""
ENV_PASS = "MINDGUARD_HUNT_PASS"                # "record" (pass 1) or "dump" (pass 2)
ENV_RECORD = "MINDGUARD_RECORD"                 # failure record path (per rank: name.rankN.json)
ENV_DUMP_ITERATION = "MINDGUARD_DUMP_ITERATION"  # pass 2: 0-based dump iteration to dump
ENV_DUMP_PATH = "MINDGUARD_DUMP_PATH"           # pass 2: dump directory
ENV_NET_NAME = "MINDGUARD_NET_NAME"             # pass 2: the dump's net_name
ENV_CAPTURE_DIR = "MINDGUARD_CAPTURE_DIR"       # pass 2 in PyNative: where the failing step is captured
ENV_REPLAY_REPORT = "MINDGUARD_REPLAY_REPORT"   # pass 2 in PyNative: where the replay report (JSON) goes
