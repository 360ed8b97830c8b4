"""A script in the style of Kubeflow's elastic "echo" example: it reads torchrun's variables with os.environ[...]
(a missing one is a KeyError), prints them, joins the process group and meets the others at a barrier.

    torchrun --nproc-per-node 2 elastic_echo.py
"""

import io
import os
import pprint
import sys

import torch.distributed as dist

if __name__ == "__main__":
    env_dict = {
        k: os.environ[k]
        for k in (
            "LOCAL_RANK", "RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "LOCAL_WORLD_SIZE", "WORLD_SIZE",
            "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT",
            "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
        )
    }
    with io.StringIO() as buff:
        print("======================================================", file=buff)
        print(f"Environment variables set by the agent on PID {os.getpid()}:", file=buff)
        pprint.pprint(env_dict, stream=buff)
        print("======================================================", file=buff)
        print(buff.getvalue())
        sys.stdout.flush()

    dist.init_process_group(backend="gloo")
    dist.barrier()
    print(f"On PID {os.getpid()}, after init process group, rank={dist.get_rank()}, "
          f"world_size = {dist.get_world_size()}, run id {os.environ['TORCHELASTIC_RUN_ID']}\n")
