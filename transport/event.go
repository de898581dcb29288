package transport

// EventType is an asynchronous event type (enum ibv_event_type subset).
type EventType uint8

// Asynchronous events.
const (
	// EventQPFatal: the QP hit a fatal error and is in ERR.
	EventQPFatal EventType = iota + 1
	// EventQPReqErr: the QP got an invalid request (responder Class J).
	EventQPReqErr
	// EventQPAccessErr: an inbound access violation moved the QP to ERR.
	EventQPAccessErr
	// EventCQErr: the CQ overran and is unusable.
	EventCQErr
	// EventSQDrained: an SQD QP finished its outstanding work.
	EventSQDrained
	// EventCommEst: first message arrived on an RTR QP.
	EventCommEst
	// EventDeviceFatal: the device is gone.
	EventDeviceFatal
)

var eventNames = [...]string{
	EventQPFatal: "QP_FATAL", EventQPReqErr: "QP_REQ_ERR", EventQPAccessErr: "QP_ACCESS_ERR",
	EventCQErr: "CQ_ERR", EventSQDrained: "SQ_DRAINED", EventCommEst: "COMM_EST", EventDeviceFatal: "DEVICE_FATAL",
}

// String is the event's verbs name.
func (t EventType) String() string { return nameOf(eventNames[:], t, "EventType") }

// AsyncEvent is an asynchronous device event. QPNum names the QP for QP
// events; CQ is set for CQ events.
type AsyncEvent struct {
	Type   EventType
	QPNum  uint32
	CQ     CQ
	Reason string // provider's explanation, for logs
}
