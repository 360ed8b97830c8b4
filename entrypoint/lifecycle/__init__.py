"""How training processes start, wait, stop and end.

``runner`` is the one path from the plan to a training process; ``rendezvous`` and ``listening`` are the
start-up waits; ``supervisor`` and ``restart_policy`` run and restart children as the platforms do;
``signals``, ``shutdown`` and ``watchdog`` stop and end processes; ``peers`` names a lost peer from its
heartbeats; ``lost_work`` says what a recovery cost.
"""
