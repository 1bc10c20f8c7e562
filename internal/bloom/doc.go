// Package bloom keeps windowed filters in Redis and decides, for a batch
// of element IDs, which are seen for the first time, in one atomic Lua
// script call per batch (one per shard on a Redis Cluster). A window's
// filter is of one of two kinds (PlanOptions.Kind): a Bloom filter in
// Redis bitmaps (KindBloom, the default), or a table of fingerprints with
// linear probing in Redis strings (KindFingerprint), which costs about
// half the Redis CPU and less memory per ID at the rates pipelines ask
// for. Everything else (windows, the lag bound, growth, shards, decision
// records, preallocation, lost keys, replicas) is the same for both.
//
// # Sizing (Bloom kind)
//
// A filter of m bits holding n elements, each setting k bits, answers
// "seen" for an element never inserted with probability p. A classic
// filter sets k independent bits: m = -n ln p / (ln 2)^2 and
// k = round(m/n ln 2), p' = (1 - e^(-kn/m))^k (StandardSizing).
//
// This package does not place bits independently: every bit access in
// Redis costs a BITFIELD sub-operation, and k = 20 of them per element at
// p = 1e-6 is what makes naive Lua filters slow. Instead an element picks
// Words words of 52 bits and sets BitsPerWord bits in each (a blocked
// filter with several blocks). Testing and setting an element is then one
// read and one write per word: 3 and 3 at p = 1e-6 instead of 20. Fewer
// words cost memory, because words fill unevenly; BlockedFPR gives the
// exact rate of a layout (a Poisson mixture over word loads), and tests
// check it against simulation and against Redis. NewPlan's objective is
// the least Redis work within a memory bound: the fewest words, then the
// fewest shards (each a script call per batch), whose window, as
// allocated, takes at most PlanOptions.MemoryFactor (1.5 by default)
// times the memory of a classic filter at stage 0's rate (p without
// growth, its share of p with growth). At p = 1e-6 that is 3
// words of 5 bits at 37.0 bits per element against 28.8; at 1e-9, 4 words
// of 5 bits at 59.6 bits against 43.1, or 5 words where the allocator's
// rounding takes 4 past the bound. PlanOptions.Layout sets a layout
// instead, as an earlier version chose it, to keep its keys.
//
// # Fingerprints
//
// A fingerprint table of one shard's stage holds M slots of b bytes. An
// element's home is slot floor(u*M), u in [0, 1) from its hash; its
// fingerprint is b bytes of its hash, never all zero, since zero marks an
// empty slot; it is stored in the first empty slot at or after its home
// (linear probing). A lookup reads from the home (one GETRANGE of 32
// slots, more only for a longer run) and compares the fingerprint with
// the slots before the first empty one (string.find); an insert is one
// SETRANGE into that empty slot. A table is never probed without end: a
// run of 512 slots (fpProbeLimit; at the highest planned load, once in
// about 10^10 inserts) makes the stage full, as reaching its capacity
// does, and the next stage takes the element, or, past the last, the
// window only tests it (counted, as past the growth cap).
//
// At load a (slots used over slots), an element not in the table is
// compared with (1/(1-a)^2 - 1)/2 used slots on average (Knuth's
// unsuccessful search in linear probing, less the empty slot that ends
// it), each holding its fingerprint with probability 1/(2^(8b) - 1). So
//
//	fpr(b, a) = ((1/(1-a)^2 - 1) / 2) / (2^(8b) - 1)    (FingerprintFPR)
//
// and a table holding its capacity has at most its stage's rate. Tests
// check the formula by simulation over millions of fresh IDs and against
// the script on Redis. The planner takes, for each stage, the width b
// (2 to 8 bytes) and the slots of least memory as allocated (jemalloc's
// size classes, filled with slots; a few keys per stage where that fills
// the classes better, each key one more name per call) whose rate at
// capacity is within the stage's share of p, at a load of at most 0.75:
// past that, runs lengthen and a lookup reads more (measured in
// fpMaxLoad's doc). For the seed's 7 million IDs per window that is
// 3-byte fingerprints at a load of 0.73 (33.5 bits per ID) at p = 1e-6,
// and 4-byte ones at 0.65 (50.3 bits) at 1e-9, against 37 and 59.6 for
// the Bloom kind. Growth stages share p as the Bloom kind's do; a later
// stage may take a wider fingerprint. Without growth a table takes
// elements up to a load of 0.9, where its rate is about four times the
// planned one, and only tests the rest (a Bloom filter would take them at
// a rate climbing without bound).
//
// A rolling test reads two tables, its bucket's and the one before it, as
// the Bloom kind reads two filters: no layout found reads one range per ID
// at the same memory. Both buckets' slots side by side in one key would
// need every element written twice, into its bucket's key and the next
// one's (the same calls per new ID, 1 read and 2 writes against 2 reads
// and 1 write, and twice the memory); one key for two buckets reads once
// only for the later of the two (1.5 reads on average) and holds the
// earlier a window longer. The second read costs about 0.4 us of Redis CPU
// per new ID (a GETRANGE whose offsets the call sends as text, see
// protocol.go).
//
// Positions and fingerprints come from the same MurmurHash3 x64 128 as the
// Bloom kind's: the shard from h2 as there, u from the top 53 bits of h1,
// the fingerprint from splitmix64 of h2 (its first b bytes, big-endian).
// Keys carry the tag "f1-" and a hash of the stages' widths, slots,
// parts and capacities, so no key of one kind is read as the other's.
//
// # Positions (Bloom kind)
//
// MurmurHash3 x64 128 of the ID gives h1 and h2. The shard is taken from
// h2; a splitmix64 stream seeded by h1 gives each word's index and its bit
// positions. Words are 52 bits wide because a BITFIELD reply reaches Lua as
// a double, exact to 2^53, and two 26-bit halves suit Lua's 32-bit bit
// library. The mapping is pinned by golden tests: filters outlive deploys
// and are shared by replicas of different versions. Every key carries a
// layout tag derived from the layout, the shard size and count, the window
// length and the replay horizon, so a configuration change starts new keys
// instead of reading old bits the wrong way.
//
// # Windows
//
// Buckets are aligned to UTC: bucket b covers Unix seconds [bL, (b+1)L).
// The bucket is chosen from the event time the caller passes. In Fixed mode
// an element is tested and set in its bucket. In Rolling mode it is tested
// in its bucket and the previous one and set in its own, so a copy whose
// event time is up to one window after the first copy's is caught wherever
// the boundary falls. Every key gets an absolute expiry in the script that
// writes it (EXPIREAT NX, then GT so a TTL only grows): a bucket lives to
// its end, plus one window in Rolling mode, plus MaxLag. A copy stamped
// later may be decided first (a backlog's partitions are read at different
// paces; an event ahead of the clock is tested in its own bucket, up to
// MaxFutureSkew; another replica's clock may run ahead), so in Rolling mode
// an element is tested against the next bucket as well from MaxFutureSkew
// plus MaxClockSkew before its bucket ends: from when any replica may have
// inserted copies there (see Clocks).
//
// Windows are made whole, one SET NX per shard key, never by the script:
// the maintenance makes each bucket's window PreallocateLead before it
// starts (Preallocate), and a batch that needs a window no one made (a
// backlog after an outage, or preallocation running late) is refused by
// the script, makes it, and is decided, as for a stage (see Growth). An
// event whose bucket starts more than MaxFutureSkew after the clock is
// Future: it is not tested and makes nothing. MaxFutureSkew defaults to
// the preallocation lead, so the only window ahead of the clock that
// events can be tested in is the next one, which the maintenance makes
// then anyway: a client with a wrong clock or time zone costs no memory
// beyond the plan, and no stall.
//
// MaxLag is the lag bound: how far behind the clock events may be decided
// with their deduplication intact, as after an outage or by a replica that
// fell behind. An event is tested against keys that live until MaxLag past
// the end of its bucket (the previous bucket's keys, in Rolling mode, expire
// then too), so until that Deadline its verdict is the same whenever it is
// decided: read live, or read hours later as a backlog. From the Deadline
// on it is Late (by the caller's clock, and again inside the script by the
// server's, which expires the keys), and an event whose bucket is beyond
// the clock's plus MaxFutureSkew is Future: neither is tested nor set,
// and the caller chooses what becomes of them. Every event decided at
// most MaxLag after its event time is within the bound. The cost is memory: the keys of MaxLag/Length more
// buckets are alive at once (Window.Live), and the decision records live
// as long as the filters they guard.
//
// # Growth
//
// A filter sized for n passes its rate p quickly once it holds more: at
// 2n the rate of a layout planned for 1e-6 is about 70 times that. With
// PlanOptions.MaxGrowth above 1, each (bucket, shard) filter is a chain of
// stages, after Almeida, Baquero, Preguiça and Hutchison ("Scalable Bloom
// Filters", 2007). Stage 0 holds n; stage i >= 1 holds n(s^i - s^(i-1)),
// so stages 0..i hold s^i n in all, with s = GrowthFactor = 4. Stage 0 is
// sized for p_0 = 0.9p (StageZeroShare); stage i >= 1's rate is
// p_i = q r^(i-1), with r = TighteningRatio = 1/2 and q chosen so that the
// later stages share what stage 0 leaves of p when full (filling the
// allocator's size class leaves it below p_0). An element is tested
// in every stage of its bucket (and of the neighbours in Rolling mode) and
// inserted in the newest, so a new element is taken for a member with
// probability at most the sum of the stages' rates, each at most its own
// while the stage holds no more than its capacity. The chain is capped (K
// stages hold s^(K-1) n >= MaxGrowth*n), and the sum is at most p at the
// cap, below it before.
//
// Why these: s = 4 reaches 64n (the default cap) in 4 stages, so an
// element is tested in at most 4 stages of a bucket (every stage is one
// more read per new element; the chain is at most MaxStages long), and a
// window at 4, 16 or 64 times its plan has filled its stages exactly:
// memory follows the load within a factor of 4 between those points. A
// window at its plan, by far the common case, costs what a lone filter
// costs: stage 0 at 0.9p takes 0.4 bits per element more than a lone
// filter at p (3x5 at 1e-6). The classic split, p_0 = p(1-r)/(1-r^K)
// (8/15 of p with 4 stages), cost 2.6 bits, and the allocator's rounding
// turned that into 5 shards of 7 MiB instead of 1 of 32 for the seed's
// 7M IDs at 1e-6: four more script calls per batch. The later stages pay
// instead, 3 to 4 bits per element more each (7% more memory at 64n), and
// only in windows that grow; at 1e-9 the allocator's classes absorb it.
// Every stage keeps the layout chosen for p_0, so a window that never
// grows makes the same Redis calls per element as a lone filter; later
// stages buy their rate with bits. Stage 0 alone sets the shard
// count; a later stage larger than one key of 128 MiB per shard is split
// into parts, keys under the shard's hash tag (PartKey), word w of the
// stage in part w / (PartBits/WordBits), so that a window that does not
// grow is not spread over the shards its largest stage would need. A
// stage that would take more than MaxShards keys in all ends the chain.
//
// Counting is exact: the script counts the elements it inserts in the
// growth record (GrowthKey), a small hash under the shard's hash tag, in
// the same call. The script never allocates a stage (nor a window, stage
// 0): a stage is made whole,
// each part in one SET NX with its expiry, by Grow (the maintenance) or by a batch
// that needs it, and a stage full hands over to the next only if that
// exists. Every new element a window holds is inserted, up to the cap:
//
//   - Ahead of need. The growth record also keeps the rate at which the
//     shard's window fills (elements inserted per second, sampled by the
//     server's clock at most every 250 ms). Once the room left in the
//     newest stage is at most that rate times the next stage's lead
//     (StageLead: 100 ms, plus 2 ms per MiB of the stage over all shards,
//     about 3 times what a SET of that size took on the development
//     machine), the call asks for the next stage in its reply and in the
//     record, and the maintenance makes it at once (GrowthWanted; its
//     5-second scan finds the record's request too). A full stage asks
//     whatever the rate.
//   - Back-pressure. A batch with a new element that needs the next stage
//     when it is not made yet is not decided: the script refuses the whole
//     call before it writes anything, naming the stages it needs, and
//     TestAndSet makes them (the same one-maker lock as the maintenance)
//     or waits while another replica makes them, then calls again. The
//     wait is bounded by Config.GrowthWait (plus, for a make the call
//     started itself, that make's own time-out); when it runs out, or a stage
//     cannot be made (Redis out of memory), the call fails with
//     ErrGrowthWait or ErrRedis, having decided nothing, and the worker
//     retries it, not ready. Refusals and waits are counted
//     (GrowthStats, and the gauges once Maintain runs). Replicas that
//     need the same stage at once all wait for the one maker; a stage is
//     only ever made by SET NX, so no call inserts into a stage that is
//     being made or replaced.
//   - The cap. Past the last stage the bucket only tests: new elements
//     are forwarded and not inserted, so their copies pass. That is the
//     price of the growth cap (PlanOptions.MaxGrowth), counted in the
//     record (c) and alerted on, and the rate stays at the chain's bound.
//
// What a stage made early costs: memory, and only for windows that came
// within their rate times the lead of a stage boundary. For the planner's
// example (7 million IDs per 10-minute window at 1e-6, 1 shard, leads
// of 0.36, 1.1 and 4.5 s for stages 1 to 3), a window filled evenly over
// its length asks for stage 1 when it is within about 4,150 IDs (0.06%)
// of its 7,000,000: a window at exactly its plan makes 128 MiB beside its
// 32 for a stage it does not fill, and one at 99.9% of its plan does not.
// (With several shards, each counts its share with three standard
// deviations of room, so that a window at its plan rarely grows.) At 16
// times the plan the window asks for stage 3 (2,176 MiB) about 830,000
// IDs (1%) before stage 2 is full. A spike, by its rate,
// gets its stages a lead before it needs them, which is the point: it
// costs the memory of the stages it fills, and one more if it ends within
// a lead of a boundary. A window filled to its plan within seconds is
// such a spike (cmd/bloom-bench fills a day's window in 8 s, and makes
// every shard's stage 1 near its end). The record's o counts inserts
// past a full stage, which only a replica of an older version makes (it
// inserted while the next stage was missing); the maintenance warns of a
// window they overfill, whose rate is then above target.
//
// # Clocks
//
// The decisions read three clocks: the event times, each replica's clock
// (Config.Now) and each Redis server's (TIME, and the expiry of keys).
// Event times may be anything: an event beyond the lag bound is Late, one
// whose bucket starts beyond MaxFutureSkew after the replica's clock is
// Future; neither is tested, and the caller forwards or dead-letters it.
// The replicas' and the servers' clocks are assumed within MaxClockSkew
// (5 s by default) of each other. Within that:
//   - Copies across a rolling boundary meet: the next bucket is read from
//     MaxFutureSkew plus MaxClockSkew before a bucket ends, whichever
//     replica decides.
//   - Lateness is judged by the replica and again by the server (whose
//     clock expires the keys): an event the server finds past its deadline
//     is not tested (Late), never tested against keys already gone.
//   - A batch that waited for a stage or a window is placed anew by the
//     clock each time it is called again, so a window that ended meanwhile
//     makes it Late instead of a refusal repeated until the wait runs out;
//     a call refused again for stages already made backs off (1 to 100
//     ms); a wait longer than CallTimeout makes the filter unhealthy
//     (Healthy), the worker not ready.
//   - A window made again where a replica had seen it made is a loss only
//     if its keys were due to live more than MaxClockSkew longer.
//
// Beyond MaxClockSkew: a replica whose clock is further behind may decide a
// copy stamped just before a boundary without reading the next bucket, so
// the copy passes; one further ahead judges events Late or Future earlier
// than the others. Nothing is lost either way (untested events are
// forwarded), but duplicates may pass. Keep the hosts on NTP.
//
// # Lost keys
//
// Redis can lose the keys of live windows: a restart without persistence,
// a failover to a replica that had not caught up, a FLUSHALL. The next
// batch would make the missing window again and duplicates would pass
// until it refilled, unnoticed. The maintenance notices (see lost.go):
// each replica remembers the windows it saw made and a per-shard marker
// key with a random token, and within one slow pass (30 s) counts every
// window whose keys are gone before they were due to expire
// (dedupe_filter_keys_lost_total per server), logging once the server and
// the windows; a batch that makes a window this replica had seen made
// reports it at once. Decision records lost with them are made again with
// a floor (the first offset they decide), so a replay of an offset decided
// before the loss is ReplayUnknown and forwarded, never read as a drop
// from the new record's empty ring.
//
// # Plans
//
// A window keeps the plan it was made with (windowplan.go): the first
// replica to make a bucket's window (its maintenance ahead of the
// bucket, or a batch that needs it) records its plan in a small key beside
// it, with the window's expiry, and every replica locates an element, makes
// stages, and keeps decision records for that window by the plan
// recorded. A change of plan (n, p, the growth cap, the kind, a new
// version's planner) takes effect with the next window made; a call reads
// each bucket by its own plan (argPlans lists every plan a call reads).
// An event not tested (Late, Future) is recorded by its window's plan if
// one is known, else by the replica's own. Limits: on a Cluster, a
// neighbour window of another shard count is in other slots and is not
// read; a window whose record was lost (see Lost keys) is read by each
// replica's own plan until the next window.
//
// # Shards and Redis Cluster
//
// A window larger than one Redis string (2^32 bits), or split on request
// to spread a Cluster's load, is divided into shards. All keys of a shard
// (its filter of every bucket and its decision records) carry the hash tag
// {pipeline:shard}, so one script call touches one slot. On a single
// server the whole batch is one call; on a Cluster there is one call per
// shard, run concurrently.
//
// # Replay-safe decisions
//
// This section is the contract of TestAndSet, for its callers.
//
// Marking an ID as seen before its event is safely forwarded turns a crash
// into loss: the redelivered event would look like a duplicate. So each
// call also records its decisions. Per shard and source partition a record
// key holds a watermark (highest decided offset + 1) and a ring of
// ReplayHorizon bits, bit o mod R holding the decision for offset o. In the
// same atomic call, an element whose offset is below the watermark gets the
// recorded decision (ReplayedFirstSeen or ReplayedDuplicate) and is neither
// tested nor set; others are decided and recorded.
//
// What a call returns:
//   - On success, one verdict per element, in the order of the elements.
//   - On error, no verdicts. ErrInvalidElement (an empty ID, no event
//     time, a bad source, a source twice in the batch) is refused before
//     anything is sent, and is refused again however often it is retried.
//     Any other error (ErrRedis, ErrTooFewReplicas inside it,
//     ErrGrowthWait) may come after the batch was applied in part or in
//     full: calling again with the same elements is safe and gives the
//     decisions of the first application.
//   - A batch whose new elements need the next stage of a growing window
//     that is not made yet waits for it, bounded by Config.GrowthWait (see
//     Growth); ErrGrowthWait then fails it having decided and written
//     nothing.
//   - Cancelling ctx abandons the calls in flight and a wait for a stage;
//     what was applied is as after any error.
//   - It is safe for concurrent use, and other replicas call at the same
//     time.
//
// The guarantee: the same source offset gets the same verdict every time,
// whatever the batch boundaries and whichever replica asks, as long as
//   - for each partition, offsets are asked in ascending order: a call
//     holding offset o is made only after every earlier call holding lower
//     offsets of that partition has returned (Kafka consumers do this);
//   - the offset is within ReplayHorizon of the newest offset decided for
//     its partition; older replays are ReplayUnknown and forwarded, since a
//     copy passed is better than an event lost;
//   - the record has not expired: it lives at least as long as any filter
//     key written with it, and one more window;
//   - Redis kept its data: after a restart without persistence both the
//     filters and the records are empty, so replays are decided afresh
//     against empty filters, or, once later offsets of the partition were
//     decided, are ReplayUnknown; either way forwarded: duplicates pass,
//     nothing is lost (see Lost keys);
//   - after a failover, the promoted replica had the call's writes: true
//     of every successful call with MinReplicas set to the replicas per
//     master (see Replicas and failover); with MinReplicas 0, the last
//     calls a master answered before it died may be forgotten, as after a
//     restart without persistence;
//   - the configuration that shapes keys is unchanged (see Positions).
//
// Inside the script every read comes first, then the records are written,
// then the filters. A failed write therefore leaves either nothing, or
// records without their filter bits, whose replays are still answered from
// the record. The script is refused before it starts when Redis is out of
// memory.
//
// # Delivered marks
//
// A replay decided before is forwarded again, which is right when the
// first decision was never delivered (its replica crashed) and a copy
// downstream when it was (its partition moved to another replica before
// the commit). So a record also keeps a delivered mark, the 63 bits from
// recordRingBit + R + 64: every offset of its partition below it was
// delivered. Filter.Delivered raises it (never lowers it) in each record a
// batch read and in the partition's home record (shard partition mod
// shards, under the replica's own plan), once the caller's output for the
// batch is acknowledged and before its offsets are committed: one call per
// shard. A replay below the mark is ReplayedDelivered: neither tested,
// recorded, forwarded nor dropped again, only committed.
//
// Why a mark in any record of the partition will do: a caller marks only
// what it delivered, from the offset it started reading at (the committed
// offset, below which everything was delivered) to the batch's last, so an
// offset below any mark was delivered, whichever shard's record holds the
// mark. Input a caller does not test (dead letters) is asked about as
// probes in the same call, read from the home record.
//
// Limits: a mark lost in a failover or with Redis's data only lets
// replays be forwarded again, as before marks, so marks wait for no
// replica; during a change of plan, replicas on different plans read
// different home records, so a dead letter may be sent again; and
// resetting a consumer group's offsets to process input again skips what
// was delivered (a new pipeline name gives new records).
//
// # Replicas and failover
//
// Redis replicates asynchronously: a master answers a call before its
// replicas have its writes, and when the master dies, the replica promoted
// in its place has lost what had not reached it. Decisions already acted
// on are then forgotten: a later copy of a forwarded event is first seen
// again and passes with another source, and a replay of a forwarded offset
// may get another verdict.
//
// Config.MinReplicas closes that gap. Each call to a shard becomes one
// pipeline on one connection to the master of the shard's slot (on a
// Cluster, found in the client's slot map): the script, a write of the
// shard's sync key (SyncKey: one byte that lives a minute), and WAIT
// MinReplicas with half the time left of the call. WAIT counts the
// replicas that have everything up to its connection's last write; the
// sync key write makes that the master's latest offset, so that a retry
// that only replays recorded decisions, writing nothing itself, also waits
// for the writes it read (Redis 7.0 moves a connection's offset on every
// command, newer versions only on writes). When fewer replicas answer, the
// call fails with ErrTooFewReplicas inside ErrRedis and no verdict is
// used. Its retry gets the recorded decisions once a replica has them, or,
// if the master died meanwhile, decisions made afresh by the promoted
// replica, which never saw them: either way agrees with what was acted on.
//
// On a Cluster the pipeline goes straight to the node, past the client's
// redirect handling, since a script redirected alone would lose its WAIT:
// MOVED, ASK, TRYAGAIN, CLUSTERDOWN or a refused connection fail the call,
// and every failure makes the client reload its slot map, so that the next
// try reaches the master serving the slot by then.
//
// The cost: each call per shard waits for a round trip from the master to
// its replica (a blocked WAIT makes the master ask its replicas for an
// acknowledgement at once) and carries one more small write; about 0.1 ms
// on loopback. A master with fewer live replicas than MinReplicas decides
// nothing: every call to it fails after half of CallTimeout. With one
// replica per master, a shard stalls while its replica is down, and after
// a failover until the old master is back as a replica of the new one and
// in sync. MinReplicas counts acknowledgements, not the replica that will
// be elected: with one replica per master they are the same; with more,
// set it to the number of replicas, or rely on Redis electing the replica
// with the largest replication offset first. Not covered: a master and all
// its replicas losing their data together; a master without persistence
// restarted before its replica took over, whose empty data set the
// replica then copies; and a forced failover (CLUSTER FAILOVER FORCE or
// TAKEOVER) to a replica that lags.
package bloom
