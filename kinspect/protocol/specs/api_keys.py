"""Kafka api keys by name, generated from the message specs by kinspect.protocol.specs.api_key_table: do not edit."""

from __future__ import annotations

PRODUCE = 0
FETCH = 1
LIST_OFFSETS = 2
METADATA = 3
LEADER_AND_ISR = 4
STOP_REPLICA = 5
UPDATE_METADATA = 6
CONTROLLED_SHUTDOWN = 7
OFFSET_COMMIT = 8
OFFSET_FETCH = 9
FIND_COORDINATOR = 10
JOIN_GROUP = 11
HEARTBEAT = 12
LEAVE_GROUP = 13
SYNC_GROUP = 14
DESCRIBE_GROUPS = 15
LIST_GROUPS = 16
SASL_HANDSHAKE = 17
API_VERSIONS = 18
CREATE_TOPICS = 19
DELETE_TOPICS = 20
DELETE_RECORDS = 21
INIT_PRODUCER_ID = 22
OFFSET_FOR_LEADER_EPOCH = 23
ADD_PARTITIONS_TO_TXN = 24
ADD_OFFSETS_TO_TXN = 25
END_TXN = 26
WRITE_TXN_MARKERS = 27
TXN_OFFSET_COMMIT = 28
DESCRIBE_ACLS = 29
CREATE_ACLS = 30
DELETE_ACLS = 31
DESCRIBE_CONFIGS = 32
ALTER_CONFIGS = 33
ALTER_REPLICA_LOG_DIRS = 34
DESCRIBE_LOG_DIRS = 35
SASL_AUTHENTICATE = 36
CREATE_PARTITIONS = 37
CREATE_DELEGATION_TOKEN = 38
RENEW_DELEGATION_TOKEN = 39
EXPIRE_DELEGATION_TOKEN = 40
DESCRIBE_DELEGATION_TOKEN = 41
DELETE_GROUPS = 42
ELECT_LEADERS = 43
INCREMENTAL_ALTER_CONFIGS = 44
ALTER_PARTITION_REASSIGNMENTS = 45
LIST_PARTITION_REASSIGNMENTS = 46
OFFSET_DELETE = 47
DESCRIBE_CLIENT_QUOTAS = 48
ALTER_CLIENT_QUOTAS = 49
DESCRIBE_USER_SCRAM_CREDENTIALS = 50
ALTER_USER_SCRAM_CREDENTIALS = 51
VOTE = 52
BEGIN_QUORUM_EPOCH = 53
END_QUORUM_EPOCH = 54
DESCRIBE_QUORUM = 55
ALTER_PARTITION = 56
UPDATE_FEATURES = 57
ENVELOPE = 58
FETCH_SNAPSHOT = 59
DESCRIBE_CLUSTER = 60
DESCRIBE_PRODUCERS = 61
BROKER_REGISTRATION = 62
BROKER_HEARTBEAT = 63
UNREGISTER_BROKER = 64
DESCRIBE_TRANSACTIONS = 65
LIST_TRANSACTIONS = 66
ALLOCATE_PRODUCER_IDS = 67
CONSUMER_GROUP_HEARTBEAT = 68
CONSUMER_GROUP_DESCRIBE = 69
CONTROLLER_REGISTRATION = 70
GET_TELEMETRY_SUBSCRIPTIONS = 71
PUSH_TELEMETRY = 72
ASSIGN_REPLICAS_TO_DIRS = 73
LIST_CONFIG_RESOURCES = 74
DESCRIBE_TOPIC_PARTITIONS = 75
SHARE_GROUP_HEARTBEAT = 76
SHARE_GROUP_DESCRIBE = 77
SHARE_FETCH = 78
SHARE_ACKNOWLEDGE = 79
ADD_RAFT_VOTER = 80
REMOVE_RAFT_VOTER = 81
UPDATE_RAFT_VOTER = 82
INITIALIZE_SHARE_GROUP_STATE = 83
READ_SHARE_GROUP_STATE = 84
WRITE_SHARE_GROUP_STATE = 85
DELETE_SHARE_GROUP_STATE = 86
READ_SHARE_GROUP_STATE_SUMMARY = 87
STREAMS_GROUP_HEARTBEAT = 88
STREAMS_GROUP_DESCRIBE = 89
DESCRIBE_SHARE_GROUP_OFFSETS = 90
ALTER_SHARE_GROUP_OFFSETS = 91
DELETE_SHARE_GROUP_OFFSETS = 92

API_NAMES: dict[int, str] = {
    0: 'Produce',
    1: 'Fetch',
    2: 'ListOffsets',
    3: 'Metadata',
    4: 'LeaderAndIsr',
    5: 'StopReplica',
    6: 'UpdateMetadata',
    7: 'ControlledShutdown',
    8: 'OffsetCommit',
    9: 'OffsetFetch',
    10: 'FindCoordinator',
    11: 'JoinGroup',
    12: 'Heartbeat',
    13: 'LeaveGroup',
    14: 'SyncGroup',
    15: 'DescribeGroups',
    16: 'ListGroups',
    17: 'SaslHandshake',
    18: 'ApiVersions',
    19: 'CreateTopics',
    20: 'DeleteTopics',
    21: 'DeleteRecords',
    22: 'InitProducerId',
    23: 'OffsetForLeaderEpoch',
    24: 'AddPartitionsToTxn',
    25: 'AddOffsetsToTxn',
    26: 'EndTxn',
    27: 'WriteTxnMarkers',
    28: 'TxnOffsetCommit',
    29: 'DescribeAcls',
    30: 'CreateAcls',
    31: 'DeleteAcls',
    32: 'DescribeConfigs',
    33: 'AlterConfigs',
    34: 'AlterReplicaLogDirs',
    35: 'DescribeLogDirs',
    36: 'SaslAuthenticate',
    37: 'CreatePartitions',
    38: 'CreateDelegationToken',
    39: 'RenewDelegationToken',
    40: 'ExpireDelegationToken',
    41: 'DescribeDelegationToken',
    42: 'DeleteGroups',
    43: 'ElectLeaders',
    44: 'IncrementalAlterConfigs',
    45: 'AlterPartitionReassignments',
    46: 'ListPartitionReassignments',
    47: 'OffsetDelete',
    48: 'DescribeClientQuotas',
    49: 'AlterClientQuotas',
    50: 'DescribeUserScramCredentials',
    51: 'AlterUserScramCredentials',
    52: 'Vote',
    53: 'BeginQuorumEpoch',
    54: 'EndQuorumEpoch',
    55: 'DescribeQuorum',
    56: 'AlterPartition',
    57: 'UpdateFeatures',
    58: 'Envelope',
    59: 'FetchSnapshot',
    60: 'DescribeCluster',
    61: 'DescribeProducers',
    62: 'BrokerRegistration',
    63: 'BrokerHeartbeat',
    64: 'UnregisterBroker',
    65: 'DescribeTransactions',
    66: 'ListTransactions',
    67: 'AllocateProducerIds',
    68: 'ConsumerGroupHeartbeat',
    69: 'ConsumerGroupDescribe',
    70: 'ControllerRegistration',
    71: 'GetTelemetrySubscriptions',
    72: 'PushTelemetry',
    73: 'AssignReplicasToDirs',
    74: 'ListConfigResources',
    75: 'DescribeTopicPartitions',
    76: 'ShareGroupHeartbeat',
    77: 'ShareGroupDescribe',
    78: 'ShareFetch',
    79: 'ShareAcknowledge',
    80: 'AddRaftVoter',
    81: 'RemoveRaftVoter',
    82: 'UpdateRaftVoter',
    83: 'InitializeShareGroupState',
    84: 'ReadShareGroupState',
    85: 'WriteShareGroupState',
    86: 'DeleteShareGroupState',
    87: 'ReadShareGroupStateSummary',
    88: 'StreamsGroupHeartbeat',
    89: 'StreamsGroupDescribe',
    90: 'DescribeShareGroupOffsets',
    91: 'AlterShareGroupOffsets',
    92: 'DeleteShareGroupOffsets',
}
