"""What a connector is declared as: the three sources read and validated into one ``ConnectorSpec``.

``sources`` reads the shipped and installed packages, the user's ``mcp.json`` and plugins, validating
each file as a pydantic model (``models``, whose values are the checked types of ``fields``; a
package's ``oauth-client.json`` is ``oauth_client``) into ``spec``'s ``ConnectorSpec``; ``trustkey``
pins trust to a spec's launch config and package content; ``watch`` re-reads the sources on a change.
"""
