"""The autoscaler: a control law, a controller that applies it, and drivers that act.

:mod:`~llmq.autoscale.law` decides (pure, tested on synthetic signals),
:mod:`~llmq.autoscale.signals` reads the cluster, :mod:`~llmq.autoscale.lease`
makes sure one controller acts at a time, :mod:`~llmq.autoscale.controller` runs
the loop, and :mod:`~llmq.autoscale.drivers` turns a target into processes (local)
or only publishes it (Kubernetes with KEDA, compose by hand).
"""
