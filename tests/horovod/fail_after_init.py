"""A Horovod script whose rank 1 fails after a successful rendezvous: that is the user's error, not a peer."""

import sys

import horovod.torch as hvd

hvd.init()
if hvd.rank() == 1:
    sys.exit(1)
hvd.join()
