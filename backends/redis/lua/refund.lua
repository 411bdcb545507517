-- Tollgate: refunds (Rust reference: each algorithm's `*_refund` in algorithms/src/, dispatched by algorithms/src/refund.rs).
--
-- This file defines one function per algorithm; the store runs them through
-- layered.lua in its 'refund' mode (Redis Cluster: a request whose layers
-- span several hash slots reserves slot by slot, and gives back what it
-- reserved when a later slot denies).
--
--   refund_<algorithm>(p1, p2, p3, a, b, c, now, cost, at, mark)
--
-- a, b, c: the stored cells (a nil: no state).
--
-- at    the effective time (µs) the reservation charged at (token bucket:
--       the remainder the charge wrote; GCRA: 0);
-- mark  token bucket: when full again, as the charge wrote it; GCRA: the
--       TAT it wrote; otherwise 0.
-- Returns: what was given back (scaled tokens, µs of TAT, counts, log
--   entries; 0 when nothing), and for counter states the cells to store
--   (a, b, c; none: write nothing).
--
-- A refund never gives back more than the charge took, and never more than
-- the state would hold had the charge not happened: between the charge and
-- the refund, other requests may have been admitted against the charged
-- state, and a bucket that would have been full meanwhile wastes refill.
-- When that cannot be ruled out the refund gives back less (or nothing):
-- a brief under-admission, never an over-admission. A state whose time is
-- before the charge's was recreated since (it expired): nothing to refund.

-- Token bucket: GCRA's refund in scaled tokens (Rust: token_bucket_refund).
-- The charge moved the instant the bucket is full again `cost × period`
-- scaled tokens later, to the mark it wrote (`mark_at`, with
-- `mark_remainder`); only what is still ahead of now is owed, and the
-- bucket never goes above full.
local function refund_token_bucket(capacity, refill, period, full_at, remainder, _, now, cost, mark_remainder, mark_at)
  if not full_at or mark_at <= now then
    return 0
  end
  local full = capacity * period
  local owed = cost * period
  local ahead_us = mark_at - now
  local ahead = owed
  -- Compared first so the product stays below 2^53.
  if ahead_us <= cdiv(full + mark_remainder, refill) then
    ahead = max(ahead_us * refill - mark_remainder, 0)
  end
  local level = token_bucket_level(full, refill, full_at, remainder, now)
  local give = min(owed, ahead, full - level)
  if give <= 0 then
    return 0
  end
  local left = level + give
  if left == full then
    return give, now, 0, 0
  end
  local until_full = cdiv(full - left, refill)
  return give, now + until_full, until_full * refill - (full - left), 0
end

-- GCRA. The charge moved the TAT `cost × interval` later, to `tat_after`;
-- without it the TAT could have been raised to now since, so only what is
-- still ahead of now goes back, and the TAT never goes below now. A state
-- recreated since (the charged one expired) owes nothing without a check:
-- a GCRA state expires only after its TAT, so `tat_after` is not ahead.
local function refund_gcra(burst, interval, _, tat, _, _, now, cost, at, tat_after)
  if not tat then
    return 0
  end
  local t = now
  local give = min(cost * interval, tat_after - t)
  if give <= 0 then
    return 0
  end
  local lowered = max(tat - give, t)
  if lowered >= tat then
    return 0
  end
  return tat - lowered, lowered, 0, 0
end

-- Fixed window: the count goes down only while it still counts the
-- charge's window.
local function refund_fixed_window(_, w, _, count, last, _, now, cost, at)
  if not count then
    return 0
  end
  if last < at or last - mod(last, w) ~= at - mod(at, w) then
    return 0
  end
  local give = min(cost, count)
  if give <= 0 then
    return 0
  end
  return give, count - give, last, 0
end

-- Sliding window counter: the charge is in the current count while the
-- state is in the charge's window, and in the previous count once the state
-- has moved to the next window; later than that it no longer counts.
local function refund_sliding_window(_, w, _, cur, prev, last, now, cost, at)
  if not cur then
    return 0
  end
  if last < at then
    return 0
  end
  local start, charged = last - mod(last, w), at - mod(at, w)
  if start == charged then
    local give = min(cost, cur)
    if give <= 0 then
      return 0
    end
    return give, cur - give, prev, last
  elseif start == charged + w then
    local give = min(cost, prev)
    if give <= 0 then
      return 0
    end
    return give, cur, prev - give, last
  end
  return 0
end

-- Sliding log: the charge appended `cost` entries equal to `at`; entries
-- equal to `at` are interchangeable and age out together, so removing up
-- to `cost` of them (newest first) removes exactly the charge's, or nothing
-- once they aged out.
local function refund_sliding_log(key, cost, at)
  -- The caller checked the key is a list.
  return redis.call('LREM', key, -cost, int(at))
end
