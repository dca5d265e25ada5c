"""Running a command's jobs, shared by ``guideloom tokenize`` and ``guideloom import``.

A command cuts its inputs into jobs of fixed shard ids and says how one job is written (``work``); this
package runs them exactly once, in this process, in worker processes (``pool``) or as Ray tasks
(``ray_tasks``), with a progress bar (``progress``), and registers the options every such command takes
(``options``). Choosing among the executors is ``run``.
"""
