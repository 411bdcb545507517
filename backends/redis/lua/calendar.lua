-- Tollgate: calendar quota (Rust reference: algorithms/src/calendar.rs).
--
-- This file defines the algorithm (`calendar`), its refund (`refund_calendar`),
-- its reward (`reward_calendar`) and the charge an admitted state marks
-- (`charge_calendar`), run through layered.lua like every algorithm.
--
--   calendar(limit, span_start, span_end, count, start, stop, now, cost)
--
-- Layer ARGV: algorithm 6, cost, limit, span start µs, span end µs: the
--   span holding the caller's time (the time zone arithmetic runs in the
--   client; spans are deterministic).
-- State: cells {count, start µs, end µs} of the span it counts, stored as
--   "a b c"; nil: none. A stored span of the one sent, or overlapping it
--   and not ended (a changed schedule), goes on in the one sent; a later
--   one goes on in itself; an earlier one counts as none. A count carried
--   from another span stays there until an admission moves it: a denial
--   waits until that span ends. A span ended at now (Redis TIME ahead of
--   the caller's clock) admits nothing, writes nothing, and says retry in
--   a millisecond.
-- Returns: as fixed_window.lua.
-- Whether the cells are a state a calendar quota writes: a count below
-- 2^53 and a span of 1 µs to MAX_CALENDAR_SPAN_US (Rust: within_reach,
-- Calendar::is_span). Any other is data Tollgate did not write.
local function calendar_understood(count, start, stop)
  return count < MAX_EXACT and start < stop and stop - start <= MAX_CALENDAR_SPAN_US
end

local function calendar(limit, span_start, span_end, stored, start, stop, now, cost)
  local count = 0
  local carried_until = nil
  if stored and start >= span_end then
    count = stored
  elseif stored and stop > span_start and stop > now then
    if (start ~= span_start or stop ~= span_end) and stored > 0 then
      carried_until = stop
    end
    count, start, stop = stored, span_start, span_end
  else
    start, stop = span_start, span_end
  end
  if stop <= now then
    return false, limit, 0, 0, ENDED_RETRY_US
  end
  if carried_until and count + cost > limit then
    local wait = after(carried_until, now)
    return false, limit, max(limit - count, 0), wait, wait
  end
  return counted(limit, count, cost, now, now, stop, start, stop)
end

-- Calendar quota: the count goes down only while it still counts the
-- charge's span.
local function refund_calendar(_, _, _, count, start, stop, now, cost, at)
  if not count or start ~= at then
    return 0
  end
  return give_from_count(count, cost, start, stop)
end

-- A reward: from the stored span's count.
local function reward_calendar(p1, p2, p3, count, start, stop, now, units)
  return refund_calendar(p1, p2, p3, count, start, stop, now, units, start)
end

-- The charge an admitted state marks: its span's start.
local function charge_calendar(_, start, _)
  return start, 0
end
