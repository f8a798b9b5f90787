"""Where kernel records come from. Each source delivers :class:`~graphmon.sources.base.Window` s.

- ``replay``: a recorded trace replayed at its recorded pace (the demo and the tests)
- ``cupti``: live CUPTI activity inside the serving process (the only module importing cupti)
- ``readers``: file readers (native format, Kineto/Chrome JSON, the raw CUPTI npz)
"""
