package srp

import "github.com/gosrp/gosrp/internal/enum"

// TaskMgmtLen is the size of SRP_TSK_MGMT.
const TaskMgmtLen = 48

// TaskFunc is a task management function (SRP r16a 6.7, after SAM-5).
type TaskFunc uint8

// Task management functions.
const (
	TaskAbortTask    TaskFunc = 0x01 // abort the task TaskTag names
	TaskAbortTaskSet TaskFunc = 0x02 // abort every task of this I_T nexus on the LUN
	TaskClearTaskSet TaskFunc = 0x04 // abort every task on the LUN
	TaskLUNReset     TaskFunc = 0x08 // reset the LUN (ib_srp's srp_reset_device)
	TaskClearACA     TaskFunc = 0x40
)

var taskFuncNames = [...]string{
	TaskAbortTask: "ABORT TASK", TaskAbortTaskSet: "ABORT TASK SET", TaskClearTaskSet: "CLEAR TASK SET",
	TaskLUNReset: "LOGICAL UNIT RESET", TaskClearACA: "CLEAR ACA",
}

func (f TaskFunc) String() string { return enum.Hex(taskFuncNames[:], f, "TaskFunc") }

// Task management response codes: byte 3 of the 4 bytes of response data
// an SRP_RSP with RSPVALID carries (SRP r16a table 24). ib_srp reads
// only that byte, and only when the response data has 4 bytes.
const (
	TaskComplete     uint8 = 0x00 // TASK MANAGEMENT FUNCTION COMPLETE
	TaskInvalidIU    uint8 = 0x02 // the request's fields are invalid
	TaskNotSupported uint8 = 0x04 // TASK MANAGEMENT FUNCTION NOT SUPPORTED
	TaskFailed       uint8 = 0x05 // TASK MANAGEMENT FUNCTION FAILED
)

// TaskMgmt is SRP_TSK_MGMT (SRP r16a 6.7). The target answers with an
// SRP_RSP carrying the request's Tag and 4 bytes of response data.
//
//	0  opcode u8 = 0x01
//	1  sol_not u8
//	2  reserved [6]
//	8  tag u64
//	16 reserved [4]
//	20 lun [8]
//	28 reserved [2]
//	30 tsk_mgmt_func u8
//	31 reserved
//	32 task_tag u64 (the task to abort, for ABORT TASK)
//	40 reserved [8]
type TaskMgmt struct {
	SolNot   uint8
	Tag      uint64
	LUN      LUN
	Function TaskFunc
	TaskTag  uint64
}

// Encode writes t into b, which must hold TaskMgmtLen bytes.
func (t *TaskMgmt) Encode(b []byte) (int, error) {
	if err := room(b, TaskMgmtLen, OpTaskMgmt); err != nil {
		return 0, err
	}
	b = b[:TaskMgmtLen]
	clear(b)
	b[0] = byte(OpTaskMgmt)
	b[1] = t.SolNot
	be.PutUint64(b[8:], t.Tag)
	copy(b[20:28], t.LUN[:])
	b[30] = byte(t.Function)
	be.PutUint64(b[32:], t.TaskTag)
	return TaskMgmtLen, nil
}

// Decode parses the layout Encode writes. An unknown function is not a
// decoding error: the target answers it TaskNotSupported.
func (t *TaskMgmt) Decode(b []byte) error {
	if err := need(b, TaskMgmtLen, OpTaskMgmt); err != nil {
		return err
	}
	t.SolNot = b[1]
	t.Tag = be.Uint64(b[8:])
	copy(t.LUN[:], b[20:28])
	t.Function = TaskFunc(b[30])
	t.TaskTag = be.Uint64(b[32:])
	return nil
}
