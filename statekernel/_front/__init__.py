"""What the two front-ends, the command line (``statekernel._cli``) and the web view
(``statekernel.web``), share: a run's text as it may be shown (``visible``, ``text``)
and the agent an option names (``agents``). Both build on this room and the public
API; neither imports the other's modules, except the command that starts the web view.
"""

__all__: list[str] = []
