"""The Horovod path: ssh-free launch through Horovod's gloo rendezvous, tuned fusion buffers, hooks loop."""
