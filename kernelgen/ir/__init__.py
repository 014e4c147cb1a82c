"""The data every stage shares: scalar expressions (``expr``), operators over symbolic tensors
(``node``), the loop IR (``loop``), substitutions of index symbols (``substitute``), the loop IR's
structural hash (``fingerprint``) and its NumPy interpreter, the reference semantics
(``interp``)."""
