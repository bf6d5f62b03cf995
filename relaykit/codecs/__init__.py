"""Payload codecs shipped with relaykit (name one with ``RELAYKIT_CODEC``, see
:mod:`relaykit.codec`)."""
