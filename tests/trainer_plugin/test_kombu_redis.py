"""kombu's Redis transport with one client per channel and acknowledgements sent together, on a
real redis-server: messages still arrive, are acknowledged once, and come back when an
acknowledgement never reached Redis."""

from __future__ import annotations

import logging
import threading
import time

import redis
from kombu import Connection, Consumer, Exchange, Producer, Queue

from trainer_plugin.transports import kombu_redis

QUEUE = Queue("acks-test", Exchange("acks-test", type="direct"), routing_key="acks-test")


def _publish(url: str, count: int) -> None:
    with Connection(url, transport=kombu_redis.TRANSPORT) as connection:
        producer = Producer(connection.default_channel)
        for i in range(count):
            producer.publish({"n": i}, exchange=QUEUE.exchange, routing_key="acks-test",
                             declare=[QUEUE], serializer="json")


def _receive(connection: Connection, count: int, timeout_s: float = 10) -> list:
    received = []
    with Consumer(connection.default_channel, queues=[QUEUE],
                  callbacks=[lambda _body, message: received.append(message)], accept=["json"]):
        deadline = time.monotonic() + timeout_s
        while len(received) < count and time.monotonic() < deadline:
            try:
                connection.drain_events(timeout=0.2)
            except TimeoutError:
                pass
    return received


def _unacked(client: redis.Redis) -> int:
    return client.hlen("unacked")


def test_redis_urls_get_this_transport_and_others_keep_kombus() -> None:
    assert kombu_redis.transport_for("redis://127.0.0.1:6379/0") == kombu_redis.TRANSPORT
    for url in ("rediss://cache:6380/0", "amqp://guest@rabbit//", "memory://", ""):
        assert kombu_redis.transport_for(url) is None


def test_a_channel_keeps_one_client_and_follows_a_new_pool(private_broker_url) -> None:
    with Connection(private_broker_url, transport=kombu_redis.TRANSPORT) as connection:
        channel = connection.default_channel
        assert isinstance(channel, kombu_redis.Channel)
        with channel.conn_or_acquire() as first, channel.conn_or_acquire() as second:
            assert first is second
        # What kombu does after a connection error: drop its pools and make new ones.
        channel._disconnect_pools()
        with channel.conn_or_acquire() as third:
            assert third is not first and third.connection_pool is channel.pool
            assert third.ping()


def test_acknowledgements_made_together_remove_every_unacked_copy(private_broker_url) -> None:
    _publish(private_broker_url, 20)
    client = redis.Redis.from_url(private_broker_url)
    with Connection(private_broker_url, transport=kombu_redis.TRANSPORT) as connection:
        messages = _receive(connection, 20)
        assert [m.decode()["n"] for m in messages] == list(range(20))
        assert _unacked(client) == 20
        with kombu_redis.acks_together(connection.default_channel):
            for message in messages:
                message.ack()
            # Sent at the end of the block, in one round trip.
            assert _unacked(client) == 20
        assert _unacked(client) == 0
        assert client.zcard("unacked_index") == 0
        assert all(m.acknowledged for m in messages)
        # Nothing comes back: the queue is empty and nothing is left to restore.
        connection.default_channel.qos.restore_unacked()
        assert client.llen("acks-test") == 0


def test_requeued_messages_inside_the_block_go_back_at_once(private_broker_url) -> None:
    _publish(private_broker_url, 3)
    client = redis.Redis.from_url(private_broker_url)
    with Connection(private_broker_url, transport=kombu_redis.TRANSPORT) as connection:
        first, second, third = _receive(connection, 3)
        with kombu_redis.acks_together(connection.default_channel):
            first.ack()
            second.requeue()
            assert client.llen("acks-test") == 1
            third.ack()
        assert _unacked(client) == 0
        again = _receive(connection, 1)
        assert [m.decode()["n"] for m in again] == [1]
        again[0].ack()


def test_acknowledgements_lost_on_the_way_are_logged_and_delivered_again(
        private_broker_url, caplog) -> None:
    _publish(private_broker_url, 4)
    client = redis.Redis.from_url(private_broker_url)
    with Connection(private_broker_url, transport=kombu_redis.TRANSPORT,
                    transport_options={"visibility_timeout": 1}) as connection:
        messages = _receive(connection, 4)
        with caplog.at_level(logging.ERROR, logger=kombu_redis.__name__):
            with kombu_redis.acks_together(connection.default_channel):
                for message in messages:
                    message.ack()
                # Redis refuses the transaction (over its memory limit, as it would be when the
                # connection drops): the block must not raise into the worker's event loop.
                client.config_set("maxmemory", 1)
                client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", 0)
        assert "delivered again after the visibility timeout" in caplog.text
        assert _unacked(client) == 4
    time.sleep(1.1)
    with Connection(private_broker_url, transport=kombu_redis.TRANSPORT,
                    transport_options={"visibility_timeout": 1}) as connection:
        connection.default_channel.qos.restore_visible(num=100)
        again = _receive(connection, 4)
        assert sorted(m.decode()["n"] for m in again) == [0, 1, 2, 3]


def test_other_transports_acknowledge_one_by_one() -> None:
    with Connection("memory://") as connection:
        channel = connection.default_channel
        Producer(channel).publish({"n": 1}, exchange=QUEUE.exchange, routing_key="acks-test",
                                  declare=[QUEUE], serializer="json")
        (message,) = _receive(connection, 1)
        with kombu_redis.acks_together(channel):
            message.ack()
        assert message.acknowledged
        channel.qos.restore_unacked()
        assert _receive(connection, 1, timeout_s=0.5) == []


def test_each_thread_batches_only_its_own_acknowledgements(private_broker_url) -> None:
    _publish(private_broker_url, 2)
    client = redis.Redis.from_url(private_broker_url)
    with Connection(private_broker_url, transport=kombu_redis.TRANSPORT) as connection:
        mine, theirs = _receive(connection, 2)
        with kombu_redis.acks_together(connection.default_channel):
            mine.ack()
            other = threading.Thread(target=theirs.ack)
            other.start()
            other.join()
            # The other thread's acknowledgement is outside any block: sent at once.
            assert _unacked(client) == 1
        assert _unacked(client) == 0
