"""What the user configured: Spark options parsed and validated on the driver.

``options``        the source's own options (subscription, offsets, streams, groups), as plain
                   picklable values
``client_config``  ``kafka.*`` options (Java consumer names) mapped to client settings
``secrets``        passwords and key material, wrapped so that no repr or log line shows them

Nothing here talks to Kafka.
"""
