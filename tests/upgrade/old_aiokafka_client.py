"""Run aiokafka 0.12.0 (its api_version setting still works; 0.13 made it a no-op) against a bootstrap address.

Usage: python old_aiokafka_client.py BOOTSTRAP TOPIC API_VERSION CLIENT_ID. The test puts
aiokafka 0.12.0's directory first on PYTHONPATH. Produces one record and tries to fetch it;
a broker that refuses the old versions makes either step fail, which is reported, not raised.
"""

from __future__ import annotations

import asyncio
import sys

import aiokafka


async def main(bootstrap: str, topic: str, api_version: str, client_id: str) -> None:
    print(f"aiokafka {aiokafka.__version__}", flush=True)
    producer = aiokafka.AIOKafkaProducer(bootstrap_servers=bootstrap, api_version=api_version, client_id=client_id,
                                         request_timeout_ms=3000, retry_backoff_ms=100)
    try:
        await producer.start()
        await asyncio.wait_for(producer.send_and_wait(topic, b"old aiokafka"), 5)
        print("produced", flush=True)
    except Exception as exc:  # noqa: BLE001 (the broker may refuse the old versions)
        print(f"produce failed: {type(exc).__name__}", flush=True)
    finally:
        await producer.stop()
    consumer = aiokafka.AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, api_version=api_version,
                                         client_id=client_id, auto_offset_reset="earliest", request_timeout_ms=3000)
    try:
        await consumer.start()
        await asyncio.wait_for(consumer.getmany(timeout_ms=2000), 5)
        print("fetched", flush=True)
    except Exception as exc:  # noqa: BLE001
        print(f"fetch failed: {type(exc).__name__}", flush=True)
    finally:
        await consumer.stop()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
