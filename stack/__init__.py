"""The single-machine stack: supervision of the roles, its health, queries and demo, and the local
services it and the tests start (tansu, Apache Kafka, ClickHouse).
"""
